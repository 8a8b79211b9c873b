#include "core/tiering/snapkv.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;

// One layer, `kv` kv heads of `group` q heads, `n` positions, `w` window queries.
struct Case {
  uint32_t kv = 1, group = 1, w = 2;
  uint64_t n = 12;
  std::vector<float> attention;

  SnapKvInput Input() const {
    return {.num_layers = 1,
            .num_q_heads = kv * group,
            .num_kv_heads = kv,
            .length = n,
            .queries = w,
            .attention = attention};
  }
};

TEST(SnapKv, KeepsTheWindowAndThePooledPeak) {
  Case c;
  c.attention.assign(c.w * c.n, 0.f);
  c.attention[3] = 1.f;         // query 0 votes for position 3
  c.attention[c.n + 3] = 0.5f;  // query 1 too
  c.attention[c.n + 8] = 0.2f;  // and a little for 8
  // Budget 5: the 2-position window (10, 11) + 3 voted; pool width 3 spreads 3's vote to 2 and
  // 4, which beat 8.
  auto mask = SnapKvSelect(c.Input(), {.window = 2, .pool_kernel = 3, .budget_tokens = 5});
  ASSERT_TRUE(mask.ok()) << mask.status();
  std::vector<uint64_t> kept;
  for (uint64_t p = 0; p < c.n; ++p) {
    if (mask->Kept(0, 0, p)) kept.push_back(p);
  }
  EXPECT_EQ(kept, (std::vector<uint64_t>{2, 3, 4, 10, 11}));
}

TEST(SnapKv, EveryHeadKeepsExactlyTheBudgetRandomized) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    Case c{.kv = uint32_t(1 + rng() % 3),
           .group = uint32_t(1 + rng() % 3),
           .w = uint32_t(1 + rng() % 4),
           .n = 8 + rng() % 40};
    std::uniform_real_distribution<float> u(0, 1);
    c.attention.resize(uint64_t{c.kv} * c.group * c.w * c.n);
    for (float& a : c.attention) a = u(rng);
    const uint64_t budget = rng() % (c.n + 4);
    auto mask = SnapKvSelect(c.Input(), {.window = c.w, .pool_kernel = 7, .budget_tokens = budget});
    ASSERT_TRUE(mask.ok()) << mask.status();
    const uint64_t expect = std::min<uint64_t>(c.n, std::max<uint64_t>(budget, c.w));
    for (uint32_t h = 0; h < c.kv; ++h) {
      EXPECT_EQ(mask->KeptCount(0, h), expect);
      for (uint64_t p = c.n - c.w; p < c.n; ++p) EXPECT_TRUE(mask->Kept(0, h, p)) << p;
    }
  }
}

TEST(SnapKv, RefusesShapesThatDoNotMatch) {
  Case c;
  c.attention.assign(5, 0.f);
  auto bad = SnapKvSelect(c.Input(), {.budget_tokens = 4});
  EXPECT_THAT(bad.status().message(), HasSubstr("attention has 5 floats"));
  c.attention.assign(c.w * c.n, 0.f);
  SnapKvInput in = c.Input();
  in.num_q_heads = 3;
  in.num_kv_heads = 2;
  EXPECT_THAT(SnapKvSelect(in, {}).status().message(), HasSubstr("num_q_heads"));
}

}  // namespace
}  // namespace kvtier::tiering
