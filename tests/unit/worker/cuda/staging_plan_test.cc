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

// Entries in source order: neighbours in the pool are neighbours in staging.
TEST(StagingPlannerTest, FirstPlanCopiesEverythingContiguouslyInSourceOrder) {
  StagingPlanner planner = *StagingPlanner::Create(2, 8);
  const std::vector<StageRequest> reqs = {Req(5), Req(9), Req(2)};
  LayerStagePlan plan = *planner.Plan(0, reqs);
  EXPECT_EQ(plan.slot, 0u);
  EXPECT_EQ(plan.copies.size(), 3u);
  EXPECT_EQ(plan.reused, 0u);
  EXPECT_EQ(plan.entry_of_request, (std::vector<uint32_t>{1, 2, 0}));
  EXPECT_EQ(plan.copies[0].src_offset, 2000u);
  EXPECT_EQ(plan.copies[1].src_offset, 5000u);
  EXPECT_EQ(plan.copies[2].src_offset, 9000u);
}

// Pages in evenly spaced slots, named in any order (a schedule's stage order), are one
// pitched copy; with the store's layout (a slot holds every layer of a page) that is one
// layer's blocks of pages in consecutive slots.
TEST(StagingPlannerTest, EvenlySpacedPagesInAnyOrderAreOnePitchedCopy) {
  const uint64_t block = 64, page_bytes = 5 * block, layer = 3;
  StagingPlanner planner = *StagingPlanner::Create(2, 16);
  std::vector<StageRequest> reqs;
  for (uint64_t slot : {4, 0, 7, 2, 1, 3, 6, 5}) {
    reqs.push_back({slot, 1, slot * page_bytes + layer * block, block, StageSource::kFull});
  }
  const LayerStagePlan plan = *planner.Plan(layer, reqs);
  const std::vector<CopyRun> runs = CoalesceFullCopies(plan.copies, block, 0);
  EXPECT_EQ(runs.size(), 8u);  // nothing contiguous in the pool
  const std::vector<StridedRun> strided = GroupStrided(runs, 0);
  ASSERT_EQ(strided.size(), 1u);
  EXPECT_EQ(strided[0].rows, 8u);
  EXPECT_EQ(strided[0].src_offset, layer * block);
  EXPECT_EQ(strided[0].src_pitch, page_bytes);
  EXPECT_EQ(strided[0].dst_pitch, block);
  // Request i's block is at its entry: the page table reads what the copy wrote.
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t row = (reqs[i].src_offset - strided[0].src_offset) / page_bytes;
    EXPECT_EQ(plan.entry_of_request[i] * block, strided[0].dst_offset + row * block);
  }
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

TEST(GroupStridedTest, GroupsEqualRunsAtConstantPitchesOnly) {
  const std::vector<CopyRun> runs = {{0, 0, 100},     {300, 100, 100},  {600, 200, 100},
                                     {900, 300, 50},  {1000, 400, 50},  {2000, 500, 50},
                                     {3000, 600, 50}, {3010, 700, 100}, {5000, 800, 100}};
  const std::vector<StridedRun> g = GroupStrided(runs, 0);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].rows, 3u);  // pitch 300 / 100
  EXPECT_EQ(g[0].src_pitch, 300u);
  EXPECT_EQ(g[1].rows, 2u);  // the size changed; then the pitch breaks (1000 -> 2000)
  EXPECT_EQ(g[2].rows, 2u);  // 2000, 3000 at pitch 1000
  EXPECT_EQ(g[3].rows, 2u);  // the size changed again: 3010, 5000 at pitch 1990
  EXPECT_EQ(g[3].src_pitch, 1990u);
  EXPECT_EQ(g[3].dst_pitch, 100u);
  EXPECT_EQ(GroupStrided({{0, 0, 100}, {50, 100, 100}}, 0).size(), 2u);  // pitch < bytes
  EXPECT_EQ(GroupStrided({{kMaxCopyPitch + 1, 0, 8}, {0, 8, 8}}, 0).size(), 2u);
  EXPECT_EQ(GroupStrided({{0, 0, 8}, {kMaxCopyPitch + 1, 8, 8}}, 0).size(), 2u);
}

// Property: strided runs move exactly the bytes of the input, byte for byte; no row crosses a
// chunk and a group stays in its first row's chunk; and the count is the greedy one: a run
// starts a new group exactly when it cannot continue the last.
TEST(GroupStridedTest, RandomLayoutsPreserveTheByteMappingAndRespectChunks) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t split = rng() % 3 == 0 ? 0 : 4096 * (1 + rng() % 4);
    const uint64_t block = 64 * (1 + rng() % 4);
    const uint64_t pitch = block * (1 + rng() % 5);
    // Slots in a pool, some consecutive, some skipped; one layer's block of each.
    std::vector<uint64_t> slots;
    for (uint64_t s = 0; slots.size() < 24; ++s) {
      if (rng() % 4 != 0) slots.push_back(s);
    }
    std::vector<StageCopy> copies;
    for (uint32_t i = 0; i < slots.size(); ++i) {
      copies.push_back({i, i, slots[i] * pitch + block / 2, block, StageSource::kFull});
    }
    const std::vector<CopyRun> runs = CoalesceFullCopies(copies, block, split);
    const std::vector<StridedRun> grouped = GroupStrided(runs, split);
    std::map<uint64_t, uint64_t> want, got;
    for (const CopyRun& r : runs) {
      for (uint64_t i = 0; i < r.bytes; ++i) want[r.src_offset + i] = r.dst_offset + i;
    }
    uint64_t rows = 0;
    for (const StridedRun& g : grouped) {
      if (g.rows > 1) {
        EXPECT_GE(g.src_pitch, g.bytes);
        EXPECT_GE(g.dst_pitch, g.bytes);
      }
      const uint64_t last = g.src_offset + (g.rows - 1) * g.src_pitch + g.bytes - 1;
      if (split > 0) {
        EXPECT_EQ(g.src_offset / split, last / split);
      }
      for (uint64_t r = 0; r < g.rows; ++r) {
        for (uint64_t i = 0; i < g.bytes; ++i) {
          EXPECT_TRUE(
              got.emplace(g.src_offset + r * g.src_pitch + i, g.dst_offset + r * g.dst_pitch + i)
                  .second);
        }
      }
      rows += g.rows;
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(rows, runs.size());
    // The greedy count, from the runs: a new group where size or pitch changes or a chunk ends.
    uint64_t expected = 0;
    for (size_t i = 0, start = 0; i < runs.size(); ++i) {
      const bool same_size = i > start && runs[i].bytes == runs[start].bytes;
      const uint64_t sp = i > start ? runs[start + 1].src_offset - runs[start].src_offset : 0;
      const uint64_t dp = i > start ? runs[start + 1].dst_offset - runs[start].dst_offset : 0;
      const bool on_pitch = i > start &&
                            runs[i].src_offset == runs[start].src_offset + (i - start) * sp &&
                            runs[i].dst_offset == runs[start].dst_offset + (i - start) * dp &&
                            sp >= runs[start].bytes && dp >= runs[start].bytes;
      const bool same_chunk = split == 0 || runs[start].src_offset / split ==
                                                (runs[i].src_offset + runs[i].bytes - 1) / split;
      if (i == start || !(same_size && on_pitch && same_chunk)) {
        ++expected;
        start = i;
      }
    }
    EXPECT_EQ(grouped.size(), expected);
  }
}

}  // namespace
}  // namespace kvtier::worker::cuda
