#include "worker/cuda/staging_plan.h"

#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

StageRequest Req(uint64_t id, uint64_t version = 1, uint64_t bytes = 100) {
  return {id, version, id * 1000, bytes, StageSource::kFull};
}

TEST(StagingPlannerTest, RejectsZeroCounts) {
  EXPECT_EQ(StagingPlanner::Create(0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StagingPlanner::Create(2, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagingPlannerTest, FirstPlanCopiesEverythingContiguously) {
  StagingPlanner planner = *StagingPlanner::Create(2, 8);
  const std::vector<StageRequest> reqs = {Req(5), Req(9), Req(2)};
  LayerStagePlan plan = *planner.Plan(0, reqs);
  EXPECT_EQ(plan.slot, 0u);
  EXPECT_EQ(plan.copies.size(), 3u);
  EXPECT_EQ(plan.reused, 0u);
  EXPECT_EQ(plan.entry_of_request, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(plan.copies[1].src_offset, 9000u);
}

TEST(StagingPlannerTest, SameLayerUnchangedPagesAreNotCopiedAgain) {
  StagingPlanner planner = *StagingPlanner::Create(4, 8);
  const std::vector<StageRequest> reqs = {Req(1), Req(2), Req(3)};
  const LayerStagePlan first = *planner.Plan(3, reqs);
  const LayerStagePlan second = *planner.Plan(3, reqs);
  EXPECT_TRUE(second.copies.empty());
  EXPECT_EQ(second.reused, 3u);
  EXPECT_EQ(second.entry_of_request, first.entry_of_request);
}

TEST(StagingPlannerTest, VersionBumpCopiesOnlyThatPage) {
  StagingPlanner planner = *StagingPlanner::Create(1, 8);
  ASSERT_TRUE(planner.Plan(0, std::vector<StageRequest>{Req(1), Req(2), Req(3)}).ok());
  const LayerStagePlan plan =
      *planner.Plan(0, std::vector<StageRequest>{Req(1), Req(2, 2), Req(3)});
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].request, 1u);
  EXPECT_EQ(plan.reused, 2u);
}

TEST(StagingPlannerTest, SlotSharedWithAnotherLayerIsStale) {
  StagingPlanner planner = *StagingPlanner::Create(2, 8);
  const std::vector<StageRequest> reqs = {Req(1), Req(2)};
  ASSERT_TRUE(planner.Plan(0, reqs).ok());
  const LayerStagePlan other = *planner.Plan(2, reqs);  // same slot, different layer
  EXPECT_EQ(other.slot, 0u);
  EXPECT_EQ(other.copies.size(), 2u);
  const LayerStagePlan back = *planner.Plan(0, reqs);
  EXPECT_EQ(back.copies.size(), 2u);
}

TEST(StagingPlannerTest, DroppedPageFreesItsEntryForANewOne) {
  StagingPlanner planner = *StagingPlanner::Create(1, 2);
  ASSERT_TRUE(planner.Plan(0, std::vector<StageRequest>{Req(1), Req(2)}).ok());
  const LayerStagePlan plan = *planner.Plan(0, std::vector<StageRequest>{Req(2), Req(7)});
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.entry_of_request[0], 1u);  // page 2 kept its entry
  EXPECT_EQ(plan.entry_of_request[1], 0u);  // page 7 took page 1's
}

TEST(StagingPlannerTest, InvalidateForcesACopy) {
  StagingPlanner planner = *StagingPlanner::Create(1, 4);
  const std::vector<StageRequest> reqs = {Req(1), Req(2)};
  ASSERT_TRUE(planner.Plan(0, reqs).ok());
  planner.Invalidate(2);
  EXPECT_EQ(planner.Plan(0, reqs)->copies.size(), 1u);
}

TEST(StagingPlannerTest, RejectsOverflowDuplicatesAndEmptyBlocksWithoutChangingState) {
  StagingPlanner planner = *StagingPlanner::Create(1, 2);
  ASSERT_TRUE(planner.Plan(0, std::vector<StageRequest>{Req(1)}).ok());
  EXPECT_EQ(planner.Plan(0, std::vector<StageRequest>{Req(1), Req(2), Req(3)}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(planner.Plan(0, std::vector<StageRequest>{Req(4), Req(4)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(planner.Plan(0, std::vector<StageRequest>{Req(4, 1, 0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(planner.Plan(0, std::vector<StageRequest>{Req(1)})->copies.empty());
}

// Property: against a model of what each slot holds, every plan copies exactly the requests whose
// (layer, page, version) is not already staged in the slot, entries are unique, and the staged
// contents the model tracks always match what the copies wrote.
TEST(StagingPlannerTest, RandomizedPlansMatchAReferenceModel) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    const uint32_t slots = 1 + rng() % 4, entries = 1 + rng() % 12, layers = 1 + rng() % 6;
    StagingPlanner planner = *StagingPlanner::Create(slots, entries);
    // Model: per slot, layer and entry -> (page, version) of what the entry holds.
    std::vector<int64_t> slot_layer(slots, -1);
    std::vector<std::map<uint32_t, std::pair<uint64_t, uint64_t>>> held(slots);
    std::map<uint64_t, uint64_t> version;
    for (int step = 0; step < 200; ++step) {
      const uint32_t layer = rng() % layers;
      std::set<uint64_t> ids;
      const uint32_t n = rng() % (entries + 1);
      while (ids.size() < n) ids.insert(rng() % 20);
      if (rng() % 5 == 0) version[rng() % 20]++;
      std::vector<StageRequest> reqs;
      for (uint64_t id : ids) reqs.push_back(Req(id, version[id]));
      const LayerStagePlan plan = *planner.Plan(layer, reqs);
      const uint32_t s = layer % slots;
      ASSERT_EQ(plan.slot, s);
      if (slot_layer[s] != layer) held[s].clear();
      slot_layer[s] = layer;
      std::set<uint32_t> used;
      std::set<uint32_t> copied;
      for (const StageCopy& c : plan.copies) {
        copied.insert(c.request);
        EXPECT_EQ(c.entry, plan.entry_of_request[c.request]);
        held[s][c.entry] = {reqs[c.request].page_id, reqs[c.request].version};
      }
      for (uint32_t i = 0; i < reqs.size(); ++i) {
        const uint32_t e = plan.entry_of_request[i];
        ASSERT_LT(e, entries);
        EXPECT_TRUE(used.insert(e).second) << "entry " << e << " handed out twice";
        const auto it = held[s].find(e);
        ASSERT_NE(it, held[s].end());
        EXPECT_EQ(it->second.first, reqs[i].page_id);
        EXPECT_EQ(it->second.second, reqs[i].version);
      }
      EXPECT_EQ(plan.reused + plan.copies.size(), reqs.size());
    }
  }
}

TEST(CoalesceTest, MergesRunsContiguousOnBothSides) {
  const std::vector<StageCopy> copies = {{0, 0, 1000, 100, StageSource::kFull},
                                         {1, 1, 1100, 100, StageSource::kFull},
                                         {2, 2, 5000, 100, StageSource::kFull},
                                         {3, 4, 5100, 100, StageSource::kFull},
                                         {4, 5, 9000, 100, StageSource::kCompressed}};
  const std::vector<CopyRun> runs = CoalesceFullCopies(copies, 100, 0);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].bytes, 200u);
  EXPECT_EQ(runs[1].src_offset, 5000u);
  EXPECT_EQ(runs[1].bytes, 100u);
  EXPECT_EQ(runs[2].dst_offset, 400u);
}

// Property: runs move exactly the bytes of the input, byte for byte, and none crosses a chunk.
TEST(CoalesceTest, RandomRunsPreserveTheByteMappingAndRespectChunks) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t split = 64 * (1 + rng() % 8);
    std::vector<CopyRun> in;
    uint64_t src = rng() % 300, dst = 0;
    for (int i = 0; i < 20; ++i) {
      const uint64_t bytes = 1 + rng() % 200;
      in.push_back({src, dst, bytes});
      src += bytes + (rng() % 3 == 0 ? rng() % 50 : 0);
      dst += bytes + (rng() % 3 == 0 ? rng() % 50 : 0);
    }
    std::map<uint64_t, uint64_t> want, got;
    for (const CopyRun& r : in) {
      for (uint64_t i = 0; i < r.bytes; ++i) want[r.src_offset + i] = r.dst_offset + i;
    }
    for (const CopyRun& r : CoalesceRuns(in, split)) {
      EXPECT_EQ(r.src_offset / split, (r.src_offset + r.bytes - 1) / split);
      for (uint64_t i = 0; i < r.bytes; ++i) got[r.src_offset + i] = r.dst_offset + i;
    }
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace kvtier::worker::cuda
