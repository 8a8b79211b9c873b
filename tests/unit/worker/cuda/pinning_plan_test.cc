#include "worker/cuda/pinning_plan.h"

#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

TEST(PinningPlanTest, ChunksCoverTheRegionExactly) {
  for (uint64_t size : {1ull, 4096ull, 10000ull, 1ull << 30, (1ull << 30) + 12345}) {
    for (uint64_t chunk : {4096ull, 1ull << 20, 256ull << 20}) {
      const std::vector<PinChunk> chunks = *PlanPinChunks(size, chunk);
      uint64_t next = 0;
      for (const PinChunk& c : chunks) {
        EXPECT_EQ(c.offset, next);
        EXPECT_GT(c.bytes, 0u);
        EXPECT_LE(c.bytes, chunk);
        EXPECT_EQ(c.offset % chunk, 0u);
        next += c.bytes;
      }
      EXPECT_EQ(next, size);
    }
  }
}

TEST(PinningPlanTest, RejectsBadSizes) {
  EXPECT_EQ(PlanPinChunks(0, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPinChunks(100, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPinChunks(100, 1000).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PinningPlanTest, ChunksCoveringARange) {
  EXPECT_EQ(ChunksCovering(0, 1, 4096).first, 0u);
  EXPECT_EQ(ChunksCovering(0, 4096, 4096).last, 0u);
  EXPECT_EQ(ChunksCovering(4095, 2, 4096).last, 1u);
  EXPECT_EQ(ChunksCovering(8192, 4096 * 3, 4096).first, 2u);
  EXPECT_EQ(ChunksCovering(8192, 4096 * 3, 4096).last, 4u);
}

}  // namespace
}  // namespace kvtier::worker::cuda
