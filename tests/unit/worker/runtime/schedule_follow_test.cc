// A worker's check of the daemon's prefetch schedule against its store: what it refuses, and
// the bytes it reads off one it accepts.

#include "worker/runtime/schedule_follow.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/store_rig.h"

namespace kvtier::worker {
namespace {

using ::kvtier::tiering::Tier;
using ::testing::HasSubstr;

class ScheduleFollowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TieredKvStoreOptions o;
    o.geometry = testing::SmolLmGeometry(16, 2);
    o.num_q_heads = 9;
    store_ = rig_.MakeStore(o);
    std::mt19937 rng(1);
    testing::AppendRandom(rng, *store_, 64);  // 4 pages a group
    // Group 0: pages 0, 1 in T1; group 1: page 0 in T2, page 1 in T1.
    ASSERT_TRUE(store_
                    ->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1},
                                      {0, 1, Tier::kT0, Tier::kT1},
                                      {1, 0, Tier::kT0, Tier::kT2},
                                      {1, 1, Tier::kT0, Tier::kT1}},
                                     *rig_.slots)
                    .ok());
  }
  uint64_t T1(uint32_t g) const { return store_->SlotBytes(PoolKind::kDdr, g); }
  uint64_t T2(uint32_t g) const { return store_->SlotBytes(PoolKind::kCompressed, g); }

  // A valid schedule: group 0 page 0 resident, page 1 staged; group 1 page 1 staged, page 0 in
  // place.
  v1::PrefetchSchedule Valid() const {
    v1::PrefetchSchedule s;
    s.set_staging_bytes(T1(0));
    s.set_h2d_bytes_per_step(T1(0) + T1(1));
    v1::GroupSchedule* g0 = s.add_groups();
    g0->add_resident(0);
    g0->add_stage(1);
    v1::GroupSchedule* g1 = s.add_groups();
    g1->add_stage(1);
    g1->add_in_place(0);
    return s;
  }

  testing::Rig rig_;
  std::unique_ptr<TieredKvStore> store_;
};

TEST_F(ScheduleFollowTest, AValidScheduleGivesTheInPlaceListsAndTheBytesOfEachClass) {
  absl::StatusOr<FollowedSchedule> f = CheckSchedule(Valid(), *store_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->pages.in_place, (std::vector<std::vector<uint32_t>>{{}, {0}}));
  EXPECT_EQ(f->pages.resident, (std::vector<std::vector<uint32_t>>{{0}, {}}));
  EXPECT_EQ(f->pages.stage, (std::vector<std::vector<uint32_t>>{{1}, {1}}));
  EXPECT_EQ(f->pages.staging_bytes, T1(0));
  EXPECT_EQ(f->pages.h2d_bytes_per_step, T1(0) + T1(1));
  EXPECT_EQ(f->resident_bytes, T1(0));
  EXPECT_EQ(f->stage_bytes, T1(0) + T1(1));
  EXPECT_EQ(f->in_place_bytes, T2(1));
  EXPECT_TRUE(store_->SetSchedule(f->pages).ok());
  EXPECT_EQ(store_->in_place_pages(), 1u);
}

TEST_F(ScheduleFollowTest, SchedulesThatDoNotMatchTheStoreAreRefusedNamingThePage) {
  struct Case {
    std::function<void(v1::PrefetchSchedule&)> spoil;
    const char* says;
  };
  const Case cases[] = {
      {[](auto& s) { s.mutable_groups(0)->add_stage(2); }, "groups[0].stage page 2 is in T0"},
      {[](auto& s) { s.mutable_groups(1)->add_in_place(7); }, "page 7 does not exist"},
      {[](auto& s) { s.mutable_groups(1)->add_resident(0); },
       "groups[1].in_place page 0 is listed twice"},
      {[](auto& s) { s.mutable_groups(0)->clear_stage(); }, "group 0 page 1 is in T1 but in no"},
      {[](auto& s) { s.add_groups(); }, "expected layer_groups = 2"},
      {[](auto& s) { s.set_staging_bytes(1); }, "over staging_bytes 1"},
      {[](auto& s) { s.set_h2d_bytes_per_step(10); }, "over h2d_bytes_per_step 10"},
  };
  for (const Case& c : cases) {
    v1::PrefetchSchedule s = Valid();
    c.spoil(s);
    absl::StatusOr<FollowedSchedule> f = CheckSchedule(s, *store_);
    ASSERT_FALSE(f.ok()) << c.says;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.says));
  }
}

}  // namespace
}  // namespace kvtier::worker
