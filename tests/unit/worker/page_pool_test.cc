#include "worker/page_pool.h"

#include <cstring>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/device_arena.h"

namespace kvtier::worker {
namespace {

using ::testing::HasSubstr;

TEST(HostPagePoolTest, IsZeroedAlignedAndSized) {
  auto pool = HostPagePool::Create(PoolKind::kDdr, 10000);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->size(), 10000u);
  EXPECT_EQ((*pool)->kind(), PoolKind::kDdr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->base()) % 4096, 0u);
  for (uint64_t i = 0; i < 10000; ++i) ASSERT_EQ((*pool)->base()[i], 0);
}

TEST(HostPagePoolTest, RejectsZeroSize) {
  EXPECT_EQ(HostPagePool::Create(PoolKind::kDdr, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalSlotAllocatorTest, GrantsAlignedDisjointSlotsUntilFull) {
  LocalSlotAllocator alloc({{PoolKind::kDdr, 10 * 1024, 4096}});
  std::set<uint64_t> offsets;
  for (int i = 0; i < 6; ++i) {
    auto off = alloc.AllocateSlot(PoolKind::kDdr, 1000);  // class 1024
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_EQ(*off % layout::kSlotAlignment, 0u);
    EXPECT_GE(*off, 4096u);
    EXPECT_TRUE(offsets.insert(*off).second);
  }
  auto full = alloc.AllocateSlot(PoolKind::kDdr, 1000);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.GrantedSlots(PoolKind::kDdr), 6u);
  EXPECT_EQ(alloc.GrantedBytes(PoolKind::kDdr), 6u * 1024);
}

TEST(LocalSlotAllocatorTest, ReusesFreedSlotsOfTheSameClass) {
  LocalSlotAllocator alloc({{PoolKind::kCompressed, 4096}});
  auto a = alloc.AllocateSlot(PoolKind::kCompressed, 2048);
  auto b = alloc.AllocateSlot(PoolKind::kCompressed, 2048);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(alloc.AllocateSlot(PoolKind::kCompressed, 2048).ok());
  ASSERT_TRUE(alloc.Free(PoolKind::kCompressed, *a).ok());
  auto c = alloc.AllocateSlot(PoolKind::kCompressed, 2000);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, *a);
}

TEST(LocalSlotAllocatorTest, RejectsFreeOfUngrantedOffsetAndUnknownKind) {
  LocalSlotAllocator alloc({{PoolKind::kDdr, 4096}});
  auto s = alloc.Free(PoolKind::kDdr, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("offset"));
  auto off = alloc.AllocateSlot(PoolKind::kDdr, 256);
  ASSERT_TRUE(off.ok());
  ASSERT_TRUE(alloc.Free(PoolKind::kDdr, *off).ok());
  EXPECT_EQ(alloc.Free(PoolKind::kDdr, *off).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc.AllocateSlot(PoolKind::kCompressed, 256).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostArenaTest, EnforcesCapacityAndTracksPeak) {
  HostArena arena(1000);
  auto a = arena.Allocate(600);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(arena.Allocate(600).status().code(), absl::StatusCode::kResourceExhausted);
  auto b = arena.Allocate(400);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(arena.used_bytes(), 1000u);
  arena.Free(*a, 600);
  arena.Free(*b, 400);
  EXPECT_EQ(arena.used_bytes(), 0u);
  EXPECT_EQ(arena.peak_bytes(), 1000u);
}

TEST(HostArenaTest, BlocksAreAlignedDisjointWritableAndReused) {
  HostArena arena(uint64_t{1} << 30);
  std::vector<uint8_t*> blocks;
  for (int i = 0; i < 200; ++i) {
    auto b = arena.Allocate(737280);  // a SmolLM page: 16 tokens x 30 layers
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 64, 0u);
    std::memset(*b, i, 737280);
    blocks.push_back(*b);
  }
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(blocks[i][0], static_cast<uint8_t>(i));
    ASSERT_EQ(blocks[i][737279], static_cast<uint8_t>(i));
  }
  const uint64_t mapped = arena.mapped_bytes();
  EXPECT_GE(mapped, 200u * 737280);
  for (uint8_t* b : blocks) arena.Free(b, 737280);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(arena.Allocate(737280).ok());
  EXPECT_EQ(arena.mapped_bytes(), mapped);  // freed blocks were reused, nothing new mapped
}

}  // namespace
}  // namespace kvtier::worker
