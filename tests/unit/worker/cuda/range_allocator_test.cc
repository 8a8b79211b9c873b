#include "worker/cuda/range_allocator.h"

#include <map>
#include <random>

#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

TEST(RangeAllocatorTest, AllocatesAlignedAndReusesFreedRanges) {
  RangeAllocator a(4096, 256);
  const uint64_t x = *a.Allocate(100), y = *a.Allocate(300);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 256u);
  EXPECT_EQ(a.used(), 256u + 512u);
  ASSERT_TRUE(a.Free(x).ok());
  EXPECT_EQ(*a.Allocate(256), 0u);
}

TEST(RangeAllocatorTest, ExhaustionAndBadFrees) {
  RangeAllocator a(1024, 256);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.Allocate(1024).ok());
  EXPECT_EQ(a.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Free(256).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.Free(0).ok());
  EXPECT_EQ(a.Free(0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RangeAllocatorTest, FreeCoalescesNeighbours) {
  RangeAllocator a(1024, 256);
  const uint64_t r0 = *a.Allocate(256), r1 = *a.Allocate(256), r2 = *a.Allocate(256);
  ASSERT_TRUE(a.Free(r0).ok());
  ASSERT_TRUE(a.Free(r2).ok());
  EXPECT_EQ(a.largest_free(), 512u);  // r2 merged with the tail
  ASSERT_TRUE(a.Free(r1).ok());
  EXPECT_EQ(a.largest_free(), 1024u);
  EXPECT_EQ(a.used(), 0u);
}

// Property: live ranges never overlap, stay inside the capacity, `used` is their sum, and
// freeing everything restores one free range.
TEST(RangeAllocatorTest, RandomizedAllocationsNeverOverlap) {
  std::mt19937_64 rng(3);
  RangeAllocator a(1 << 20, 64);
  std::map<uint64_t, uint64_t> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t bytes = 1 + rng() % 20000;
      absl::StatusOr<uint64_t> off = a.Allocate(bytes);
      if (!off.ok()) {
        EXPECT_EQ(off.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      EXPECT_EQ(*off % 64, 0u);
      live[*off] = a.RoundUp(bytes);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(a.Free(it->first).ok());
      live.erase(it);
    }
    uint64_t end = 0, sum = 0;
    for (const auto& [off, bytes] : live) {
      ASSERT_GE(off, end);
      end = off + bytes;
      sum += bytes;
    }
    ASSERT_LE(end, a.capacity());
    ASSERT_EQ(sum, a.used());
  }
  for (const auto& [off, bytes] : live) ASSERT_TRUE(a.Free(off).ok());
  EXPECT_EQ(a.largest_free(), a.capacity());
}

}  // namespace
}  // namespace kvtier::worker::cuda
