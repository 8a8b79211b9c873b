#include "daemon/slot_allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "core/layout/shm_abi.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(SlotAllocatorTest, RoundsToAlignmentAndAccounts) {
  SlotAllocator a(16 * kMiB);
  auto s = a.Allocate(1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bytes(), 1024u);
  EXPECT_EQ(s->offset() % layout::kSlotAlignment, 0u);
  EXPECT_EQ(a.used_bytes(), 1024u);
  EXPECT_EQ(a.slots_used(), 1u);
  EXPECT_GE(a.reserved_bytes(), 1024u);
  s->Reset();
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.reserved_bytes(), 0u);  // the empty extent went back
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SlotAllocatorTest, RejectsZeroAndOversizedRequests) {
  SlotAllocator a(kMiB);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(2 * kMiB).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SlotAllocatorTest, ReturnsResourceExhaustedWhenPoolFull) {
  SlotAllocator a(64 * 1024);
  std::vector<Slot> slots;
  for (;;) {
    auto s = a.Allocate(4096);
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    slots.push_back(std::move(*s));
  }
  EXPECT_EQ(slots.size(), 16u);  // a short pool is filled completely
  EXPECT_EQ(a.used_bytes(), a.capacity());
  slots.clear();
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_extent(), a.capacity());
}

TEST(SlotAllocatorTest, SlotsLargerThanAnExtentWork) {
  SlotAllocator a(32 * kMiB);
  auto big = a.Allocate(5 * kMiB + 3);
  ASSERT_TRUE(big.ok());
  auto small = a.Allocate(300);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(big->offset() + big->bytes() <= small->offset() ||
              small->offset() + small->bytes() <= big->offset());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SlotAllocatorTest, MovedSlotIsFreedOnce) {
  SlotAllocator a(kMiB * 4);
  Slot outer;
  {
    auto s = a.Allocate(512);
    ASSERT_TRUE(s.ok());
    outer = std::move(*s);
    EXPECT_FALSE(s->valid());
  }
  EXPECT_EQ(a.slots_used(), 1u);
  outer = Slot();
  EXPECT_EQ(a.slots_used(), 0u);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

// Randomized alloc/free of mixed sizes: no two live slots overlap, every slot lies in the pool,
// invariants hold throughout, accounting returns to zero, and the free space coalesces back.
TEST(SlotAllocatorTest, RandomMixedSizesNeverOverlapAndBalance) {
  std::mt19937_64 rng(12345);
  const uint64_t capacity = 64 * kMiB;
  SlotAllocator a(capacity);
  const std::vector<uint64_t> sizes = {256, 3000, 24576, 98304, 400000, 3 * kMiB};
  std::vector<Slot> live;
  uint64_t expect_used = 0;
  for (int step = 0; step < 20000; ++step) {
    bool alloc = live.empty() || (rng() % 100) < 55;
    if (alloc) {
      uint64_t want = sizes[rng() % sizes.size()] - (rng() % 200);
      auto s = a.Allocate(want);
      if (!s.ok()) {
        ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      ASSERT_GE(s->bytes(), want);
      ASSERT_LE(s->offset() + s->bytes(), capacity);
      expect_used += s->bytes();
      live.push_back(std::move(*s));
    } else {
      size_t i = rng() % live.size();
      expect_used -= live[i].bytes();
      std::swap(live[i], live.back());
      live.pop_back();
    }
    ASSERT_EQ(a.used_bytes(), expect_used);
    if (step % 500 == 0) {
      ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
      std::vector<std::pair<uint64_t, uint64_t>> r;
      for (const Slot& s : live) r.emplace_back(s.offset(), s.bytes());
      std::sort(r.begin(), r.end());
      for (size_t k = 1; k < r.size(); ++k) {
        ASSERT_LE(r[k - 1].first + r[k - 1].second, r[k].first) << "overlap at step " << step;
      }
    }
  }
  live.clear();
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.slots_used(), 0u);
  EXPECT_EQ(a.reserved_bytes(), 0u);
  EXPECT_EQ(a.num_free_extents(), 1u);
  EXPECT_EQ(a.largest_free_extent(), a.capacity());
}

// Fragmentation bound: after any history, filling a class from empty extents wastes nothing,
// and the slack inside extents (reserved - used) never exceeds one extent per size class plus
// the bytes of slots freed since the class last allocated (which it reuses first).
TEST(SlotAllocatorTest, FillFromEmptyReachesCapacityPerClass) {
  for (uint64_t size : std::vector<uint64_t>{256, 1000, 65536, 700000, 3 * kMiB}) {
    SlotAllocator a(48 * kMiB);
    std::vector<Slot> live;
    for (;;) {
      auto s = a.Allocate(size);
      if (!s.ok()) break;
      live.push_back(std::move(*s));
    }
    const uint64_t slot = (size + 255) / 256 * 256;
    // Whatever is left cannot hold another slot.
    EXPECT_LT(a.capacity() - a.used_bytes(), slot) << "size " << size;
  }
}

TEST(SlotAllocatorTest, SlackBoundedUnderSteadyChurn) {
  std::mt19937_64 rng(7);
  SlotAllocator a(256 * kMiB);
  const std::vector<uint64_t> sizes = {4096, 12288, 49152, 196608};
  std::vector<Slot> live;
  // Steady state: keep about half the pool in use with random replacement.
  for (int step = 0; step < 30000; ++step) {
    if (a.used_bytes() < a.capacity() / 2 || live.empty()) {
      auto s = a.Allocate(sizes[rng() % sizes.size()]);
      ASSERT_TRUE(s.ok()) << "allocation failed at " << a.used_bytes() << " of " << a.capacity();
      live.push_back(std::move(*s));
    } else {
      size_t i = rng() % live.size();
      std::swap(live[i], live.back());
      live.pop_back();
    }
  }
  // Slack must stay well below the used bytes: lowest-address-first reuse keeps extents dense.
  const double slack = static_cast<double>(a.reserved_bytes() - a.used_bytes());
  EXPECT_LT(slack, 0.5 * a.used_bytes())
      << "reserved " << a.reserved_bytes() << " used " << a.used_bytes();
  EXPECT_TRUE(a.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvtier::daemon
