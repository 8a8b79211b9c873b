#include "worker/fenced_releases.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Tokens complete in order up to `done`, as copies on one stream do.
struct FakeTokens {
  CopyToken done = 0;
  bool operator()(CopyToken t) const { return t <= done; }
};

struct FreedLog {
  std::vector<uint8_t*> blocks;
  void operator()(uint8_t* b, uint64_t) { blocks.push_back(b); }
};

TEST(FencedReleasesTest, BlockWithNoPendingCopyIsFreedAtOnce) {
  FencedReleases fence;
  FreedLog freed;
  uint8_t block[64];
  fence.HoldBlock(kNoCopyPending, block, 64, std::ref(freed));
  EXPECT_THAT(freed.blocks, ElementsAre(block));
  EXPECT_EQ(fence.held_blocks(), 0u);
  EXPECT_EQ(fence.held_block_bytes(), 0u);
}

TEST(FencedReleasesTest, BlockIsFreedOnlyOnceItsCopyCompleted) {
  FencedReleases fence;
  FreedLog freed;
  FakeTokens tokens;
  uint8_t a[64], b[64];
  fence.HoldBlock(3, a, 64, std::ref(freed));
  fence.HoldBlock(5, b, 32, std::ref(freed));
  EXPECT_EQ(fence.held_block_bytes(), 96u);
  EXPECT_EQ(fence.BlocksToken(), 5u);
  fence.Poll(std::ref(tokens), std::ref(freed));
  EXPECT_THAT(freed.blocks, IsEmpty());
  tokens.done = 4;
  fence.Poll(std::ref(tokens), std::ref(freed));
  EXPECT_THAT(freed.blocks, ElementsAre(a));
  EXPECT_EQ(fence.held_block_bytes(), 32u);
  tokens.done = 5;
  fence.Poll(std::ref(tokens), std::ref(freed));
  EXPECT_THAT(freed.blocks, ElementsAre(a, b));
  EXPECT_EQ(fence.held_blocks(), 0u);
  EXPECT_EQ(fence.BlocksToken(), kNoCopyPending);
}

TEST(FencedReleasesTest, SlotIsReportedOnlyAfterItsCopyLanded) {
  FencedReleases fence;
  FreedLog unused;
  FakeTokens tokens;
  fence.HoldSlot(2, {PoolKind::kDdr, 4096});
  fence.HoldSlot(kNoCopyPending, {PoolKind::kCompressed, 0});
  fence.HoldSlot(7, {PoolKind::kDdr, 8192});
  EXPECT_EQ(fence.SlotsToken(), 7u);
  // Only the slot no copy reads is reported before any Poll.
  EXPECT_THAT(fence.TakeLandedSlots(), ElementsAre(ReleasedSlot{PoolKind::kCompressed, 0}));
  tokens.done = 2;
  fence.Poll(std::ref(tokens), std::ref(unused));
  EXPECT_THAT(fence.TakeLandedSlots(), ElementsAre(ReleasedSlot{PoolKind::kDdr, 4096}));
  EXPECT_EQ(fence.SlotsToken(), 7u);
  EXPECT_THAT(fence.TakeLandedSlots(), IsEmpty());
  tokens.done = 9;
  fence.Poll(std::ref(tokens), std::ref(unused));
  EXPECT_THAT(fence.TakeLandedSlots(), ElementsAre(ReleasedSlot{PoolKind::kDdr, 8192}));
  EXPECT_EQ(fence.held_slots(), 0u);
  EXPECT_EQ(fence.SlotsToken(), kNoCopyPending);
}

}  // namespace
}  // namespace kvtier::worker
