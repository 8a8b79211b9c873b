#include "core/tiering/config.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;

TEST(TieringConfigTest, DefaultsAreValidAndMatchDesign) {
  TieringConfig c;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.page_tokens, 16u);
  EXPECT_EQ(c.sink_tokens, 4u);
  EXPECT_EQ(c.window_tokens, 128u);
  EXPECT_TRUE(c.protect_prompt);
  EXPECT_EQ(c.retier_interval, 64u);
  EXPECT_EQ(c.page_score, kSum);
  EXPECT_EQ(c.budgets.evict_ratio, 0);
  EXPECT_EQ(c.budgets.hbm_ratio, 1);
  EXPECT_EQ(c.budgets.compress_ratio, 0);
}

struct BadCase {
  const char* name;
  TieringConfig config;
  const char* field;
  const char* value;
};

TieringConfig With(void (*edit)(TieringConfig&)) {
  TieringConfig c;
  edit(c);
  return c;
}

TEST(TieringConfigTest, RejectsBadValuesNamingFieldAndValue) {
  const BadCase cases[] = {
      {"page0", With([](TieringConfig& c) { c.page_tokens = 0; }), "page_tokens", "0"},
      {"retier0", With([](TieringConfig& c) { c.retier_interval = 0; }), "retier_interval", "0"},
      {"evict>1", With([](TieringConfig& c) { c.budgets.evict_ratio = 1.5; }),
       "budgets.evict_ratio", "1.5"},
      {"evict<0", With([](TieringConfig& c) { c.budgets.evict_ratio = -0.25; }),
       "budgets.evict_ratio", "-0.25"},
      {"hbm>1", With([](TieringConfig& c) { c.budgets.hbm_ratio = 2; }), "budgets.hbm_ratio", "2"},
      {"hbm nan", With([](TieringConfig& c) { c.budgets.hbm_ratio = std::nan(""); }),
       "budgets.hbm_ratio", "nan"},
      {"compress<0", With([](TieringConfig& c) { c.budgets.compress_ratio = -1; }),
       "budgets.compress_ratio", "-1"},
      {"sum>1", With([](TieringConfig& c) {
         c.budgets = {0.6, 1, 0.5};
       }),
       "evict_ratio + budgets.compress_ratio", "1.1"},
  };
  for (const BadCase& c : cases) {
    absl::Status s = c.config.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.field)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.value)) << c.name;
  }
}

TEST(TieringConfigTest, AcceptsBoundaryRatios) {
  TieringConfig c;
  c.budgets = {.evict_ratio = 0.7, .hbm_ratio = 0, .compress_ratio = 0.3};
  EXPECT_TRUE(c.Validate().ok());
  c.budgets = {.evict_ratio = 1, .hbm_ratio = 1, .compress_ratio = 0};
  EXPECT_TRUE(c.Validate().ok());
}

TEST(TieringConfigTest, FloorAndCeilRatioTreatDecimalRatiosExactly) {
  EXPECT_EQ(FloorRatio(0.29, 100), 29u);  // 0.29 × 100 = 28.999999999999996 in double
  EXPECT_EQ(FloorRatio(0.3, 10), 3u);
  EXPECT_EQ(FloorRatio(0.25, 10), 2u);
  EXPECT_EQ(FloorRatio(1.0, 7), 7u);
  EXPECT_EQ(FloorRatio(0.0, 7), 0u);
  EXPECT_EQ(CeilRatio(0.5, 9), 5u);
  EXPECT_EQ(CeilRatio(0.07, 100), 7u);  // 7.000000000000001 in double
  EXPECT_EQ(CeilRatio(0.0, 9), 0u);
  // Against integer arithmetic for every k/1000 and a spread of n.
  for (uint64_t k = 0; k <= 1000; ++k) {
    for (uint64_t n : {0ull, 1ull, 7ull, 100ull, 999ull, 1000ull, 123457ull, 1000000ull}) {
      const double r = static_cast<double>(k) / 1000.0;
      ASSERT_EQ(FloorRatio(r, n), k * n / 1000) << k << " " << n;
      ASSERT_EQ(CeilRatio(r, n), (k * n + 999) / 1000) << k << " " << n;
    }
  }
}

TEST(TieringConfigTest, RetierEveryIntervalStepsAndAtPrefillEnd) {
  TieringConfig c;
  EXPECT_TRUE(IsRetierStep(c, 0));
  EXPECT_FALSE(IsRetierStep(c, 1));
  EXPECT_FALSE(IsRetierStep(c, 63));
  EXPECT_TRUE(IsRetierStep(c, 64));
  EXPECT_TRUE(IsRetierStep(c, 128));
}

}  // namespace
}  // namespace kvtier::tiering
