#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/cuda_device_arena.h"

namespace kvtier::worker::cuda {
namespace {

TEST(CudaDeviceArenaGpuTest, AllocatesAlignedDisjointDeviceBlocksWithinTheBudget) {
  KVTIER_SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaDeviceArena> arena = *CudaDeviceArena::Create(1 << 20);
  DeviceArena& base = *arena;  // used through the worker's interface
  EXPECT_FALSE(base.host_accessible());
  std::vector<uint8_t*> blocks;
  for (int i = 0; i < 17; ++i) {  // 17 * 60160 <= 1 MiB < 18 * 60160
    absl::StatusOr<uint8_t*> b = base.Allocate(60000);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 256, 0u);
    blocks.push_back(*b);
  }
  EXPECT_EQ(base.Allocate(60000).status().code(), absl::StatusCode::kResourceExhausted);
  for (size_t i = 1; i < blocks.size(); ++i) EXPECT_GE(blocks[i] - blocks[i - 1], 60000);
  // Blocks are device memory: write one, read it back.
  ASSERT_CUDA_OK(cudaMemset(blocks[3], 0x5A, 60000));
  std::vector<uint8_t> host(60000);
  ASSERT_CUDA_OK(cudaMemcpy(host.data(), blocks[3], host.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::set<uint8_t>(host.begin(), host.end()), std::set<uint8_t>{0x5A});
  base.Free(blocks[3], 60000);
  EXPECT_EQ(*base.Allocate(50000), blocks[3]);
  EXPECT_EQ(arena->peak_bytes(), 17u * 60160);
  EXPECT_EQ(CudaDeviceArena::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

// An error the store handles (reports as a status) is cleared from the thread's last error:
// otherwise the next kernel launcher, which returns cudaGetLastError(), fails for it.
TEST(CudaDeviceArenaGpuTest, AnArenaTheDeviceCannotHoldLeavesNoErrorForTheNextLaunch) {
  KVTIER_SKIP_WITHOUT_GPU();
  const absl::StatusOr<std::unique_ptr<CudaDeviceArena>> huge =
      CudaDeviceArena::Create(uint64_t{1} << 52);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace kvtier::worker::cuda
