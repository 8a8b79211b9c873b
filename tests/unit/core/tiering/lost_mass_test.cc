// The guardrail's estimates (core/tiering/lost_mass.h) on hand-computed cases.

#include "core/tiering/lost_mass.h"

#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

constexpr Tier T0 = Tier::kT0, T1 = Tier::kT1, T2 = Tier::kT2, T3 = Tier::kT3;

TEST(LostMassTest, PageQueriesCountQueriesFromThePageMiddleAndAtLeastOne) {
  // Page 2 of 4 tokens holds positions 8..11, middle 9.5: a 20-token sequence saw 10.5 queries.
  EXPECT_DOUBLE_EQ(PageQueries(2, 4, 20), 10.5);
  EXPECT_DOUBLE_EQ(PageQueries(0, 1, 1), 1.0);
  EXPECT_DOUBLE_EQ(PageQueries(5, 4, 3), 1.0);  // not written yet: no division by <= 0
}

TEST(LostMassTest, PageMassEstimateIsTheMeanPerQueryAndDecaysOnceFrozen) {
  EXPECT_DOUBLE_EQ(PageMassEstimate(2.1f, 2, 4, 20), double{2.1f} / 10.5);
  // The same frozen score ten times older draws a tenth.
  EXPECT_NEAR(PageMassEstimate(1.f, 0, 1, 10) / PageMassEstimate(1.f, 0, 1, 100), 10.0, 1e-12);
  EXPECT_EQ(PageMassEstimate(-1.f, 0, 1, 5), 0.0);
}

TEST(LostMassTest, EvictedEstimateSumsOnlyTheEvictedPages) {
  const float scores[] = {4.f, 3.f, 2.f, 1.f};
  const Tier tiers[] = {T3, T0, T3, T2};
  // length 8, page_tokens 2: page 0 middle 0.5 (7.5 queries), page 2 middle 4.5 (3.5 queries).
  EXPECT_DOUBLE_EQ(EvictedMassEstimate(scores, tiers, 2, 8), 4.0 / 7.5 + 2.0 / 3.5);
  const Tier none[] = {T0, T1, T2, T0};
  EXPECT_EQ(EvictedMassEstimate(scores, none, 2, 8), 0.0);
  // Pages past the placement are live.
  EXPECT_DOUBLE_EQ(EvictedMassEstimate(scores, absl::MakeConstSpan(tiers, 1), 2, 8), 4.0 / 7.5);
}

TEST(LostMassTest, CompressedLostMassWeighsTheT2PagesMassByTheirError) {
  const float gained[] = {8.f, 4.f, 2.f, 6.f};
  const Tier tiers[] = {T0, T2, T1, T2};
  const float errors[] = {0.5f, 0.01f, 0.5f, 0.02f};
  // Over 4 steps: (4 × 0.01 + 6 × 0.02) / 4.
  EXPECT_NEAR(CompressedLostMass(gained, tiers, errors, 4), (0.04 + 0.12) / 4, 1e-9);
  EXPECT_EQ(CompressedLostMass(gained, tiers, errors, 0), 0.0);
  LostMass m{.compressed = 0.25, .evicted = 0.5};
  EXPECT_DOUBLE_EQ(m.total(), 0.75);
}

}  // namespace
}  // namespace kvtier::tiering
