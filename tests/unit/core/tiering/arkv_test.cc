#include "core/tiering/arkv.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;
constexpr Tier T0 = Tier::kT0, T2 = Tier::kT2, T3 = Tier::kT3;

TEST(ArkvTest, PrefillStatsFollowTheReferenceFormulas) {
  // One head, two queries, two keys: rows (0.25, 0.75) and (0.75, 0.25).
  const std::vector<float> a = {0.25f, 0.75f, 0.75f, 0.25f};
  auto s = ArkvPrefillStats(a, 1, 2, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  const double h = -(0.25 * std::log(0.25 + 1e-10) + 0.75 * std::log(0.75 + 1e-10));
  EXPECT_NEAR(s->entropy, 2 * h, 1e-9);
  // Each key: values {0.25, 0.75}, unbiased variance 0.125; two keys.
  EXPECT_NEAR(s->variance, 0.25, 1e-9);
  // Two symmetric values: m4 / m2² = 1 per key.
  EXPECT_NEAR(s->kurtosis, 2.0, 1e-9);
}

TEST(ArkvTest, OqRatioIsTheProductOfTemperedStatisticsOverTheMax) {
  const ArkvConfig config;
  const std::vector<ArkvLayerStats> stats = {{2.0, 0.5, 3.0}, {4.0, 0.25, 6.0}};
  auto r = ArkvOqRatios(stats, config);
  ASSERT_TRUE(r.ok()) << r.status();
  auto oq = [&](const ArkvLayerStats& s) {
    return std::pow(s.entropy, 1 / 7.7744) * std::pow(s.variance, 1 / 5.4070) *
           std::pow(s.kurtosis, 1 / 5.5277);
  };
  const double top = std::max(oq(stats[0]), oq(stats[1]));
  EXPECT_NEAR((*r)[0], oq(stats[0]) / top, 1e-12);
  EXPECT_NEAR((*r)[1], oq(stats[1]) / top, 1e-12);
  EXPECT_DOUBLE_EQ(std::max((*r)[0], (*r)[1]), 1.0);
  EXPECT_THAT(ArkvOqRatios(std::vector<ArkvLayerStats>{{1, -1, 1}}, config).status().message(),
              HasSubstr("stats[0]"));
}

TEST(ArkvTest, HeavyHitterIsMeanPlusGammaVarianceSmoothedWithoutTheRecentWindow) {
  ArkvConfig config;
  config.recent_tokens = 2;
  config.gamma = 10;
  // One head, two queries, 8 keys: key 3 gets (0.2, 0.6), others 0.1 / 0.1.
  const uint64_t n = 8;
  std::vector<float> a(2 * n, 0.1f);
  a[3] = 0.2f;
  a[n + 3] = 0.6f;
  auto s = ArkvHeavyHitterScores(a, 1, 1, 2, n, config);
  ASSERT_TRUE(s.ok()) << s.status();
  // Raw: key 3 = 0.4 + 10 × 0.08 = 1.2; others 0.1. Width-5 zero-padded average over keys 0..5.
  const double raw3 = 0.4 + 10 * 0.08;
  EXPECT_NEAR((*s)[0], (0.1 * 3) / 5, 1e-6);         // keys 0, 1, 2 (two pads)
  EXPECT_NEAR((*s)[1], (0.1 * 3 + raw3) / 5, 1e-6);  // keys 0..3 (one pad)
  EXPECT_NEAR((*s)[3], (0.1 * 4 + raw3) / 5, 1e-6);
  EXPECT_NEAR((*s)[5], (0.1 * 2 + raw3) / 5, 1e-6);  // keys 3, 4, 5: 6 and 7 are recent
  EXPECT_EQ((*s)[6], 0.0f);
  EXPECT_EQ((*s)[7], 0.0f);
}

TEST(ArkvTest, DecodeStepScoresAreTheMeanOfOneQuery) {
  ArkvConfig config;
  config.recent_tokens = 0;
  config.smoothing_width = 1;
  const std::vector<float> a = {0.1f, 0.2f, 0.7f, 0.3f, 0.3f, 0.4f};  // 2 q heads, 1 kv head
  auto s = ArkvHeavyHitterScores(a, 2, 1, 1, 3, config);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR((*s)[0], 0.2, 1e-6);
  EXPECT_NEAR((*s)[1], 0.25, 1e-6);
  EXPECT_NEAR((*s)[2], 0.55, 1e-6);
}

// Two layers with OQ ratios 1 and 0: the same eviction in both, survivors all Original in the
// first layer and all Quantized in the second; the recent window stays Original.
TEST(ArkvTest, TriStatePerLayer) {
  TieringConfig config;
  config.page_tokens = 1;
  config.sink_tokens = 0;
  config.protect_prompt = true;
  config.budgets.evict_ratio = 0.5;
  ArkvConfig arkv;
  arkv.recent_tokens = 2;
  // P = 2, L = 10: candidates 2..7 (6), evict 3.
  const std::vector<float> row = {0, 0, 6, 1, 5, 2, 4, 3, 0, 0};
  std::vector<float> scores = row;
  scores.insert(scores.end(), row.begin(), row.end());
  Placement empty{.num_groups = 2, .num_pages = 0, .tiers = {}};
  const std::vector<double> ratios = {1.0, 0.0};
  auto d = ArkvDecide({.sequence = {.prompt_tokens = 2, .length = 10},
                       .current = empty,
                       .page_scores = scores,
                       .oq_ratios = ratios},
                      config, arkv);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<Tier> expected = {T0, T0, T0, T3, T0, T3, T0, T3, T0, T0,
                                      T0, T0, T2, T3, T2, T3, T2, T3, T0, T0};
  EXPECT_EQ(d->placement.tiers, expected);
  const std::vector<double> wrong = {1.0};
  EXPECT_THAT(ArkvDecide({.sequence = {.prompt_tokens = 2, .length = 10},
                          .current = empty,
                          .page_scores = scores,
                          .oq_ratios = wrong},
                         config, arkv)
                  .status()
                  .message(),
              HasSubstr("oq_ratios has 1"));
}

TEST(ArkvTest, LayerPageScoresAverageKvHeadsThenAggregate) {
  const std::vector<float> heads = {1, 2, 3, 4, 5, 3, 4, 5, 6, 7};  // 2 kv heads × 5
  auto sum = ArkvLayerPageScores(heads, 2, 5, 2, kSum);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, (std::vector<float>{2 + 3, 4 + 5, 6}));
  auto max = ArkvLayerPageScores(heads, 2, 5, 2, kMax);
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(*max, (std::vector<float>{3, 5, 6}));
  EXPECT_THAT(ArkvLayerPageScores(heads, 3, 5, 2, kSum).status().message(),
              HasSubstr("head_scores has 10"));
}

TEST(ArkvTest, RejectsBadInput) {
  ArkvConfig config;
  config.tau_kurtosis = 0;
  EXPECT_THAT(config.Validate().message(), HasSubstr("tau_kurtosis"));
  EXPECT_THAT(ArkvPrefillStats(std::vector<float>{0.5f, NAN}, 1, 1, 2).status().message(),
              HasSubstr("attention[1]"));
  EXPECT_THAT(
      ArkvHeavyHitterScores(std::vector<float>(5), 2, 1, 1, 3, ArkvConfig{}).status().message(),
      HasSubstr("attention has 5"));
}

}  // namespace
}  // namespace kvtier::tiering
