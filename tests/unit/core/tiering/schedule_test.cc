#include "core/tiering/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;

TEST(ShareLinksTest, SplitsAContendedLinkMaxMinFairly) {
  // 4 GPUs behind one 55 GB/s switch uplink: the small demand is met, the rest split evenly.
  auto share = ShareLinks({55e9}, {{0, 5e9}, {0, 40e9}, {0, 40e9}, {0, 40e9}});
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_DOUBLE_EQ((*share)[0], 5e9);
  for (int i = 1; i < 4; ++i) EXPECT_DOUBLE_EQ((*share)[i], 50e9 / 3);
}

TEST(ShareLinksTest, RefusesBadInputNamingIt) {
  auto bad_link = ShareLinks({55e9}, {{0, 1e9}, {3, 1e9}});
  EXPECT_THAT(bad_link.status().message(), HasSubstr("demand 1: link 3 of 1"));
  auto negative = ShareLinks({55e9}, {{0, -1}});
  EXPECT_THAT(negative.status().message(), HasSubstr("demand 0"));
  auto capacity = ShareLinks({std::nan("")}, {});
  EXPECT_THAT(capacity.status().message(), HasSubstr("link 0"));
}

// Properties over random topologies: capacity never exceeded, nobody over its demand, an
// uncontended link grants every demand, and a GPU held below its demand gets at least as much
// as every other GPU on its link (max-min fairness).
TEST(ShareLinksTest, RandomTopologiesKeepTheInvariants) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 2000; ++trial) {
    const int links = 1 + static_cast<int>(rng() % 4);
    std::vector<double> capacity(links);
    for (double& c : capacity) c = 1e9 * (1 + rng() % 64);
    std::vector<LinkDemand> demands(1 + rng() % 12);
    for (LinkDemand& d : demands) {
      d.link = static_cast<uint32_t>(rng() % links);
      d.bytes_per_second = (rng() % 5 == 0) ? 0 : 1e9 * (rng() % 40);
    }
    auto share = ShareLinks(capacity, demands);
    ASSERT_TRUE(share.ok());
    for (int l = 0; l < links; ++l) {
      double used = 0, asked = 0;
      for (size_t i = 0; i < demands.size(); ++i) {
        if (demands[i].link != static_cast<uint32_t>(l)) continue;
        used += (*share)[i];
        asked += demands[i].bytes_per_second;
        EXPECT_LE((*share)[i], demands[i].bytes_per_second);
        EXPECT_GE((*share)[i], 0);
      }
      EXPECT_LE(used, capacity[l] * (1 + 1e-12));
      if (asked <= capacity[l]) {
        EXPECT_NEAR(used, asked, asked * 1e-12);
      }
      for (size_t a = 0; a < demands.size(); ++a) {
        if (demands[a].link != static_cast<uint32_t>(l)) continue;
        if ((*share)[a] >= demands[a].bytes_per_second * (1 - 1e-12)) continue;
        for (size_t b = 0; b < demands.size(); ++b) {
          if (demands[b].link == static_cast<uint32_t>(l)) {
            EXPECT_GE((*share)[a] * (1 + 1e-12), (*share)[b]) << "trial " << trial;
          }
        }
      }
    }
  }
}

TEST(SchedulePagesTest, HottestResidentThenStagedThenInPlace) {
  std::vector<SchedulePage> pages = {{0.1f, 10}, {0.9f, 10}, {0.5f, 10}, {0.7f, 10}, {0.2f, 10}};
  StepSchedule s = SchedulePages(pages, {.staging_bytes = 20, .h2d_bytes_per_step = 10});
  EXPECT_EQ(s.resident, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(s.staged, (std::vector<uint32_t>{2}));
  EXPECT_EQ(s.in_place, (std::vector<uint32_t>{4, 0}));
  EXPECT_EQ(s.in_place_bytes, 20u);
}

// Properties: every page in exactly one class, budgets kept, and (equal page sizes) every
// resident page at least as hot as every staged one, every staged one as any in place.
TEST(SchedulePagesTest, RandomPagesArePartitionedByHeat) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> score(0, 1);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<SchedulePage> pages(rng() % 300);
    for (SchedulePage& p : pages) p = {score(rng), 4096};
    const ScheduleBudget budget{.staging_bytes = 4096 * (rng() % 100),
                                .h2d_bytes_per_step = 4096 * (rng() % 100) + rng() % 4096};
    StepSchedule s = SchedulePages(pages, budget);
    std::vector<int> seen(pages.size(), 0);
    for (auto* cls : {&s.resident, &s.staged, &s.in_place}) {
      for (uint32_t i : *cls) ++seen[i];
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    EXPECT_LE(s.resident_bytes, budget.staging_bytes);
    EXPECT_LE(s.staged_bytes, budget.h2d_bytes_per_step);
    EXPECT_EQ(s.resident_bytes + s.staged_bytes + s.in_place_bytes, 4096 * pages.size());
    auto min_of = [&](const std::vector<uint32_t>& v) {
      float m = 2;
      for (uint32_t i : v) m = std::min(m, pages[i].score);
      return m;
    };
    auto max_of = [&](const std::vector<uint32_t>& v) {
      float m = -1;
      for (uint32_t i : v) m = std::max(m, pages[i].score);
      return m;
    };
    EXPECT_GE(min_of(s.resident), max_of(s.staged));
    EXPECT_GE(min_of(s.staged), max_of(s.in_place));
  }
}

}  // namespace
}  // namespace kvtier::tiering
