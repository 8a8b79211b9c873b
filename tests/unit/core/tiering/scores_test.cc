#include "core/tiering/scores.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

ScoreAccumulator Make(uint32_t layers, uint32_t heads, uint32_t groups = 1) {
  auto acc = ScoreAccumulator::Create(layers, heads, groups);
  EXPECT_TRUE(acc.ok()) << acc.status();
  return std::move(*acc);
}

TEST(ScoreAccumulatorTest, AddsMeanOverHeadsThenMeanOverLayers) {
  ScoreAccumulator acc = Make(2, 2);
  // [layer][head][position], 3 positions.
  const std::vector<float> step = {0.2f, 0.3f, 0.5f, 0.4f, 0.5f, 0.1f,   // layer 0
                                   0.6f, 0.2f, 0.2f, 0.0f, 0.8f, 0.2f};  // layer 1
  ASSERT_TRUE(acc.AddStep(step, 3).ok());
  // position 0: layer means 0.3, 0.3 → 0.3; position 1: 0.4, 0.5 → 0.45; 2: 0.3, 0.2 → 0.25.
  EXPECT_THAT(acc.TokenScores(0),
              ElementsAre(FloatNear(0.3f, 1e-6), FloatNear(0.45f, 1e-6), FloatNear(0.25f, 1e-6)));
  ASSERT_TRUE(acc.AddStep(step, 3).ok());
  EXPECT_THAT(acc.TokenScores(0),
              ElementsAre(FloatNear(0.6f, 1e-6), FloatNear(0.9f, 1e-6), FloatNear(0.5f, 1e-6)));
}

TEST(ScoreAccumulatorTest, NonFiniteLayerIsSkippedForThatPositionOnly) {
  ScoreAccumulator acc = Make(2, 1);
  const float nan = std::nanf("");
  ASSERT_TRUE(acc.AddStep(std::vector<float>{nan, 0.4f, 0.2f, 0.6f}, 2).ok());
  // position 0: only layer 1 is finite → 0.2; position 1: mean(0.4, 0.6) = 0.5.
  EXPECT_THAT(acc.TokenScores(0), ElementsAre(FloatNear(0.2f, 1e-6), FloatNear(0.5f, 1e-6)));
  ASSERT_TRUE(acc.AddStep(std::vector<float>{nan, 0, INFINITY, 0}, 2).ok());
  EXPECT_FLOAT_EQ(acc.TokenScores(0)[0], 0.2f);  // no finite layer: no gain
}

TEST(ScoreAccumulatorTest, HeadSummedLayoutMatchesPerHead) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0, 1);
  ScoreAccumulator per_head = Make(3, 4, 3), summed = Make(3, 4, 3);
  for (uint64_t len = 5; len < 40; len += 7) {
    std::vector<float> a(3 * 4 * len), s(3 * len, 0.0f);
    for (uint32_t l = 0; l < 3; ++l) {
      for (uint32_t h = 0; h < 4; ++h) {
        for (uint64_t i = 0; i < len; ++i) {
          a[(l * 4 + h) * len + i] = u(rng);
          s[l * len + i] += a[(l * 4 + h) * len + i];
        }
      }
    }
    ASSERT_TRUE(per_head.AddStep(a, len).ok());
    ASSERT_TRUE(summed.AddStep(s, len, AttentionLayout::kHeadSummed).ok());
  }
  for (uint32_t g = 0; g < 3; ++g) {
    for (uint64_t i = 0; i < per_head.length(); ++i) {
      EXPECT_NEAR(per_head.TokenScores(g)[i], summed.TokenScores(g)[i], 1e-5);
    }
  }
}

TEST(ScoreAccumulatorTest, LayerGroupsAverageTheirOwnLayers) {
  ScoreAccumulator acc = Make(3, 1, 2);  // groups: layer {0}, layers {1, 2}
  ASSERT_TRUE(acc.AddStep(std::vector<float>{1.0f, 0.2f, 0.6f}, 1).ok());
  EXPECT_FLOAT_EQ(acc.TokenScores(0)[0], 1.0f);
  EXPECT_FLOAT_EQ(acc.TokenScores(1)[0], 0.4f);
}

TEST(ScoreAccumulatorTest, PrefillSeedsFromColumnSumsAndDecodeGrowsTheSequence) {
  ScoreAccumulator acc = Make(1, 1);
  ASSERT_TRUE(acc.SeedPrefill(std::vector<float>{2.5f, 1.0f, 0.5f}, 3).ok());
  ASSERT_TRUE(acc.AddStep(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, 4).ok());
  EXPECT_THAT(acc.TokenScores(0), ElementsAre(FloatNear(2.6f, 1e-6), FloatNear(1.2f, 1e-6),
                                              FloatNear(0.8f, 1e-6), FloatNear(0.4f, 1e-6)));
}

TEST(ScoreAccumulatorTest, FrozenPositionsKeepTheirScore) {
  ScoreAccumulator acc = Make(1, 1);
  ASSERT_TRUE(acc.AddStep(std::vector<float>{1, 1, 1, 1}, 4).ok());
  Placement p{.num_groups = 1, .num_pages = 2, .tiers = {Tier::kT0, Tier::kT3}};
  ASSERT_TRUE(acc.FreezeEvicted(p, 2).ok());
  ASSERT_TRUE(acc.AddStep(std::vector<float>{1, 1, 1, 1, 1}, 5).ok());
  EXPECT_THAT(acc.TokenScores(0), ElementsAre(2, 2, 1, 1, 1));
  EXPECT_TRUE(acc.IsFrozen(0, 3));
  EXPECT_FALSE(acc.IsFrozen(0, 4));
}

TEST(ScoreAccumulatorTest, PageScoresSumOrMaxIncludingPartialLastPage) {
  ScoreAccumulator acc = Make(1, 1);
  ASSERT_TRUE(acc.AddStep(std::vector<float>{1, 4, 2, 3, 5}, 5).ok());
  auto sum = acc.PageScores(0, 2, kSum);
  auto max = acc.PageScores(0, 2, kMax);
  ASSERT_TRUE(sum.ok() && max.ok());
  EXPECT_THAT(*sum, ElementsAre(5, 5, 5));
  EXPECT_THAT(*max, ElementsAre(4, 3, 5));
  TieringConfig config;
  config.page_tokens = 2;
  config.page_score = kMax;
  auto from_config = acc.PageScores(0, config);
  ASSERT_TRUE(from_config.ok());
  EXPECT_EQ(*from_config, *max);
  auto all = acc.AllPageScores(4);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ElementsAre(10, 5));
}

TEST(ScoreAccumulatorTest, RejectsBadInputAndChangesNothing) {
  EXPECT_THAT(ScoreAccumulator::Create(0, 1).status().message(), HasSubstr("num_layers"));
  EXPECT_THAT(ScoreAccumulator::Create(2, 0).status().message(), HasSubstr("num_heads"));
  EXPECT_THAT(ScoreAccumulator::Create(2, 1, 3).status().message(), HasSubstr("layer_groups"));
  ScoreAccumulator acc = Make(2, 2);
  ASSERT_TRUE(acc.AddStep(std::vector<float>(2 * 2 * 3, 0.5f), 3).ok());
  auto wrong = acc.AddStep(std::vector<float>(7, 0.5f), 3);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("attention has 7 values"));
  auto shrink = acc.AddStep(std::vector<float>(2 * 2 * 2, 0.5f), 2);
  EXPECT_THAT(shrink.message(), HasSubstr("length must not shrink"));
  EXPECT_THAT(acc.SeedPrefill(std::vector<float>(1), 3).message(), HasSubstr("column_sums"));
  EXPECT_EQ(acc.length(), 3u);
  EXPECT_THAT(acc.TokenScores(0), ElementsAre(0.5f, 0.5f, 0.5f));
  EXPECT_THAT(acc.PageScores(1, 2).status().message(), HasSubstr("group"));
  EXPECT_THAT(acc.PageScores(0, 0).status().message(), HasSubstr("page_tokens"));
}

// The device backend accumulates mass / (H × layers of the group) layer by layer and step by
// step, read out once per re-tiering; the host rule takes per-step means. Same masses, same
// scores up to f32 rounding, for every group split and with frozen positions left alone.
TEST(DeviceScoreRuleTest, AgreesWithTheHostRuleOnTheSameMasses) {
  std::mt19937 rng(11);
  for (const uint32_t groups : {1u, 2u, 3u}) {
    const uint32_t layers = 6, heads = 9;
    ScoreAccumulator host = Make(layers, heads, groups);
    ScoreAccumulator device = Make(layers, heads, groups);
    std::vector<std::vector<float>> acc(groups);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    uint64_t length = 40;
    for (int step = 0; step < 30; ++step, ++length) {
      // [layer][length], head-summed: each head's softmax sums to 1, so the mass sums to H.
      std::vector<float> attention(layers * length);
      for (uint32_t l = 0; l < layers; ++l) {
        float total = 0;
        for (uint64_t i = 0; i < length; ++i) total += attention[l * length + i] = u(rng);
        for (uint64_t i = 0; i < length; ++i) attention[l * length + i] *= heads / total;
      }
      ASSERT_TRUE(host.AddStep(attention, length, AttentionLayout::kHeadSummed).ok());
      for (uint32_t g = 0; g < groups; ++g) {
        const uint32_t begin = g * layers / groups, end = (g + 1) * layers / groups;
        acc[g].resize(length, 0.f);
        for (uint32_t l = begin; l < end; ++l) {
          AccumulateDeviceMass(absl::MakeConstSpan(attention).subspan(l * length, length),
                               DeviceMassWeight(heads, end - begin), absl::MakeSpan(acc[g]));
        }
      }
      if (step == 10) {  // a re-tiering: read out, then freeze an evicted range on both
        for (uint32_t g = 0; g < groups; ++g) {
          ASSERT_TRUE(device.AddScores(g, acc[g]).ok());
          acc[g].assign(length, 0.f);
          ASSERT_TRUE(host.Freeze(g, {4, 12}).ok());
          ASSERT_TRUE(device.Freeze(g, {4, 12}).ok());
        }
      }
    }
    for (uint32_t g = 0; g < groups; ++g) ASSERT_TRUE(device.AddScores(g, acc[g]).ok());
    for (uint32_t g = 0; g < groups; ++g) {
      const auto h = host.TokenScores(g), d = device.TokenScores(g);
      ASSERT_EQ(h.size(), d.size());
      for (size_t i = 0; i < h.size(); ++i) {
        ASSERT_NEAR(h[i], d[i], 1e-5f * std::max(1.f, h[i])) << "group " << g << " position " << i;
      }
    }
  }
}

TEST(DeviceScoreRuleTest, AddScoresRejectsABadGroupOrAShrinkingLengthAndChangesNothing) {
  ScoreAccumulator acc = Make(2, 1);
  ASSERT_TRUE(acc.AddScores(0, std::vector<float>{1.f, 2.f, 3.f}).ok());
  absl::Status s = acc.AddScores(1, std::vector<float>{1.f, 1.f, 1.f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("group"));
  s = acc.AddScores(0, std::vector<float>{1.f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gained"));
  EXPECT_THAT(acc.TokenScores(0), ElementsAre(1.f, 2.f, 3.f));
}

}  // namespace
}  // namespace kvtier::tiering
