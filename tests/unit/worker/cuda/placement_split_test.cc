#include "worker/cuda/placement_split.h"

#include <cmath>

#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

TEST(PlacementSplitTest, SevenBChainHasAboutHalfTheCandidatesInT1) {
  const PageSplit s = *SplitPages(2048, 16, SplitKnobs{});
  EXPECT_EQ(s.tier.size(), 128u);
  EXPECT_EQ(s.protected_pages, 17u);  // prompt 8 pages + sink page + window 8 pages
  EXPECT_EQ(s.eligible_pages, 111u);
  EXPECT_EQ(s.evicted_pages, 3u);  // floor(0.03 * 111)
  EXPECT_EQ(s.t0_pages, 63u);      // ceil(0.5 * 125)
  EXPECT_EQ(s.t1_pages, 128u - 63u - 3u);
  EXPECT_NEAR(static_cast<double>(s.t1_pages) / s.eligible_pages, 0.5, 0.1);
}

TEST(PlacementSplitTest, ProtectedPagesStayInT0) {
  SplitKnobs k;
  k.hbm_ratio = 0.0;
  k.evict_ratio = 1.0;
  const PageSplit s = *SplitPages(1000, 16, k);
  for (uint32_t p = 0; p < s.tier.size(); ++p) {
    const uint32_t b = p * 16, e = std::min(b + 16, 1000u);
    const bool prot = b < 128 + 4 || e > 1000 - 128;
    EXPECT_EQ(s.tier[p], prot ? PageTier::kT0 : PageTier::kEvicted) << p;
  }
}

// Property over random knobs: budgets hold exactly as DESIGN.md states them.
TEST(PlacementSplitTest, BudgetsHoldForRandomKnobs) {
  for (uint32_t seed = 1; seed < 200; ++seed) {
    SplitKnobs k;
    k.seed = seed;
    k.hbm_ratio = (seed % 11) / 10.0;
    k.evict_ratio = (seed % 7) / 10.0;
    const uint32_t length = 100 + seed * 37, pt = 1 + seed % 32;
    const PageSplit s = *SplitPages(length, pt, k);
    EXPECT_EQ(s.t0_pages + s.t1_pages + s.evicted_pages, s.tier.size());
    EXPECT_EQ(s.evicted_pages, static_cast<uint32_t>(std::floor(k.evict_ratio * s.eligible_pages)));
    const uint32_t live = static_cast<uint32_t>(s.tier.size()) - s.evicted_pages;
    const auto budget = static_cast<uint32_t>(std::ceil(k.hbm_ratio * live));
    // T0 = the protected pages, then candidates up to the budget, never more than is live.
    EXPECT_EQ(s.t0_pages, std::min(std::max(budget, s.protected_pages), live));
  }
}

TEST(PlacementSplitTest, ZeroEvictionEvictsNothing) {
  SplitKnobs k;
  k.evict_ratio = 0.0;
  EXPECT_EQ(SplitPages(4096, 16, k)->evicted_pages, 0u);
}

TEST(PlacementSplitTest, RejectsBadKnobs) {
  SplitKnobs k;
  k.hbm_ratio = 1.5;
  EXPECT_EQ(SplitPages(100, 16, k).status().code(), absl::StatusCode::kInvalidArgument);
  k.hbm_ratio = 0.5;
  k.evict_ratio = -0.1;
  EXPECT_EQ(SplitPages(100, 16, k).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitPages(0, 16, SplitKnobs{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitPages(10, 0, SplitKnobs{}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::worker::cuda
