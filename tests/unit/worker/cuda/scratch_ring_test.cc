// The reuse rule of the stager's T2 scratch (worker/cuda/scratch_ring.h), randomized against a
// model of the entries: a batch is told to wait for exactly the live batches whose entries it
// takes, so consecutive small batches (one page of T2 per call) wait for nothing until the ring
// wraps.

#include "worker/cuda/scratch_ring.h"

#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

TEST(ScratchRingTest, PagesInARowWaitOnlyWhenTheRingWraps) {
  ScratchRing ring(256);
  int waits = 0;
  for (uint64_t page = 0; page < 64; ++page) {  // 32 layers per page: 8 pages per lap
    const ScratchRing::Reservation r = ring.Reserve(32, page);
    EXPECT_EQ(r.first, (page % 8) * 32);
    waits += !r.reused.empty();
    if (page >= 8) {
      EXPECT_EQ(r.reused, std::vector<uint64_t>{page - 8});
    }
  }
  EXPECT_EQ(waits, 64 - 8) << "each wait is for the page a lap earlier, never the one before";
}

TEST(ScratchRingTest, RandomBatchesWaitForExactlyTheLiveBatchesTheyOverwrite) {
  std::mt19937 rng(7);
  for (uint32_t capacity : {1u, 7u, 64u, 256u}) {
    ScratchRing ring(capacity);
    std::vector<int64_t> owner(capacity, -1);  // the live batch holding each entry
    for (uint64_t id = 0; id < 2000; ++id) {
      if (rng() % 4 == 0 && id > 0) {  // an earlier batch is seen complete
        const uint64_t done = rng() % id;
        ring.Completed(done);
        std::replace(owner.begin(), owner.end(), static_cast<int64_t>(done), int64_t{-1});
      }
      const uint32_t n = 1 + rng() % capacity;
      const ScratchRing::Reservation r = ring.Reserve(n, id);
      ASSERT_LE(r.first + n, capacity);
      std::vector<uint64_t> expected;
      for (uint32_t e = r.first; e < r.first + n; ++e) {
        if (owner[e] >= 0 &&
            std::find(expected.begin(), expected.end(), owner[e]) == expected.end()) {
          expected.push_back(owner[e]);
        }
      }
      std::vector<uint64_t> got = r.reused;
      std::sort(got.begin(), got.end());
      std::sort(expected.begin(), expected.end());
      ASSERT_EQ(got, expected) << "capacity " << capacity << " batch " << id;
      for (uint64_t gone : got) {  // waited for: their other entries are free too
        std::replace(owner.begin(), owner.end(), static_cast<int64_t>(gone), int64_t{-1});
      }
      for (uint32_t e = r.first; e < r.first + n; ++e) owner[e] = static_cast<int64_t>(id);
    }
  }
}

}  // namespace
}  // namespace kvtier::worker::cuda
