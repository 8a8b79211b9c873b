#include "core/tiering/h2o.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;

HeadScoreAccumulator Make(uint32_t layers, uint32_t q_heads, uint32_t kv_heads) {
  auto acc = HeadScoreAccumulator::Create(layers, q_heads, kv_heads);
  EXPECT_TRUE(acc.ok()) << acc.status();
  return std::move(*acc);
}

std::vector<uint64_t> KeptPositions(const KeepMask& m, uint32_t l, uint32_t h) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < m.length; ++i) {
    if (m.Kept(l, h, i)) out.push_back(i);
  }
  return out;
}

// Position 2 draws most of the attention for ten steps and little at the last one; position 5
// draws attention only at the last step. One heavy hitter + 2 recent: H2O keeps the cumulative
// heavy hitter 2, where a one-step score (the published reproductions' mistake) keeps 5.
TEST(H2oTest, KeepsTheCumulativeHeavyHitterThatOneStepWouldDrop) {
  const uint64_t n = 12;
  HeadScoreAccumulator cumulative = Make(1, 1, 1), one_step = Make(1, 1, 1);
  for (int step = 0; step < 10; ++step) {
    std::vector<float> a(n, 0.02f);
    a[2] = 0.8f;
    ASSERT_TRUE(cumulative.AddStep(a, n).ok());
  }
  std::vector<float> last(n, 0.05f);
  last[2] = 0.01f;
  last[5] = 0.5f;
  ASSERT_TRUE(cumulative.AddStep(last, n).ok());
  ASSERT_TRUE(one_step.AddStep(last, n).ok());
  const H2oConfig config{.heavy_ratio = 0,
                         .recent_ratio = 0,
                         .heavy_tokens = 1,
                         .recent_tokens = 2,
                         .protect_prompt = false};
  const SequenceState seq{.prompt_tokens = 0, .length = n};
  auto kept = H2oSelect(cumulative, KeepMask::AllKept(1, 1, n), seq, config);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(KeptPositions(*kept, 0, 0), (std::vector<uint64_t>{2, 10, 11}));
  auto naive = H2oSelect(one_step, KeepMask::AllKept(1, 1, n), seq, config);
  ASSERT_TRUE(naive.ok());
  EXPECT_EQ(KeptPositions(*naive, 0, 0), (std::vector<uint64_t>{5, 10, 11}));
}

TEST(H2oTest, DecidesPerLayerAndPerKvHeadWithGqaMeans) {
  // 1 layer, 4 query heads over 2 kv heads; 6 positions; kv head 0 (q 0, 1) favours position 0,
  // kv head 1 (q 2, 3) favours position 1.
  const uint64_t n = 6;
  HeadScoreAccumulator acc = Make(1, 4, 2);
  std::vector<float> a(4 * n, 0.1f);
  a[0 * n + 0] = 0.9f;
  a[1 * n + 0] = 0.7f;
  a[2 * n + 1] = 0.9f;
  a[3 * n + 1] = 0.6f;
  ASSERT_TRUE(acc.AddStep(a, n).ok());
  EXPECT_FLOAT_EQ(acc.Scores(0, 0)[0], 0.8f);
  EXPECT_FLOAT_EQ(acc.Scores(0, 1)[1], 0.75f);
  const H2oConfig config{.heavy_ratio = 0,
                         .recent_ratio = 0,
                         .heavy_tokens = 1,
                         .recent_tokens = 1,
                         .protect_prompt = false};
  auto kept = H2oSelect(acc, KeepMask::AllKept(1, 2, n), {.prompt_tokens = 0, .length = n}, config);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(KeptPositions(*kept, 0, 0), (std::vector<uint64_t>{0, 5}));
  EXPECT_EQ(KeptPositions(*kept, 0, 1), (std::vector<uint64_t>{1, 5}));
}

// Greedy H2O over a growing sequence with the published 10% + 10% defaults: monotone, and each
// head keeps exactly min(live, heavy) outside the recent window plus the window.
TEST(H2oTest, RandomizedRunsAreMonotoneAndHoldTheBudget) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0, 1);
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t layers = 2, q_heads = 4, kv_heads = 2;
    HeadScoreAccumulator acc = Make(layers, q_heads, kv_heads);
    const uint64_t prompt = 20 + trial;
    std::vector<float> seed(layers * q_heads * prompt);
    for (float& x : seed) x = u(rng);
    ASSERT_TRUE(acc.SeedPrefill(seed, prompt).ok());
    KeepMask mask = KeepMask::AllKept(layers, kv_heads, prompt);
    const H2oConfig config;  // 0.1 heavy + 0.1 recent
    for (uint64_t n = prompt + 1; n < prompt + 150; ++n) {
      std::vector<float> a(layers * q_heads * n);
      for (float& x : a) x = u(rng) / n;
      ASSERT_TRUE(acc.AddStep(a, n).ok());
      auto next = H2oSelect(acc, mask, {.prompt_tokens = prompt, .length = n}, config);
      ASSERT_TRUE(next.ok()) << next.status();
      const uint64_t heavy = n / 10, recent = n / 10;
      for (uint32_t l = 0; l < layers; ++l) {
        for (uint32_t h = 0; h < kv_heads; ++h) {
          for (uint64_t i = 0; i < mask.length; ++i) {
            if (!mask.Kept(l, h, i)) {
              ASSERT_FALSE(next->Kept(l, h, i)) << "resurrected " << i;
            }
          }
          uint64_t outside = 0;
          for (uint64_t i = 0; i + recent < n; ++i) outside += next->Kept(l, h, i);
          for (uint64_t i = n - recent; i < n; ++i) ASSERT_TRUE(next->Kept(l, h, i));
          ASSERT_LE(outside, heavy);
        }
      }
      mask = std::move(*next);
    }
  }
}

TEST(H2oTest, RejectsBadInput) {
  EXPECT_THAT(HeadScoreAccumulator::Create(1, 3, 2).status().message(),
              HasSubstr("multiple of num_kv_heads"));
  HeadScoreAccumulator acc = Make(1, 2, 1);
  EXPECT_THAT(acc.AddStep(std::vector<float>(5), 3).message(), HasSubstr("attention has 5"));
  ASSERT_TRUE(acc.AddStep(std::vector<float>(6, 0.1f), 3).ok());
  EXPECT_THAT(acc.AddStep(std::vector<float>(4), 2).message(), HasSubstr("shrink"));
  H2oConfig bad;
  bad.heavy_ratio = 1.5;
  EXPECT_THAT(H2oSelect(acc, KeepMask::AllKept(1, 1, 3), {0, 3}, bad).status().message(),
              HasSubstr("heavy_ratio"));
  EXPECT_THAT(H2oSelect(acc, KeepMask::AllKept(2, 1, 3), {0, 3}, H2oConfig{}).status().message(),
              HasSubstr("keep mask"));
  EXPECT_THAT(H2oSelect(acc, KeepMask::AllKept(1, 1, 3), {0, 4}, H2oConfig{}).status().message(),
              HasSubstr("sequence.length"));
}

}  // namespace
}  // namespace kvtier::tiering
