// Pinning a shared-memory mapping in chunks, and DMA round trips through it.

#include <unistd.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/cuda/shm_region.h"

namespace kvtier::worker::cuda {
namespace {

using ::kvtier::testing::DeviceBuffer;

std::unique_ptr<ShmRegion> MakeShm(const char* tag, uint64_t bytes) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> r =
      ShmRegion::Create(absl::StrCat("/kvtier-gpu-", tag, "-", getpid()), bytes);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

TEST(PinnedMappingGpuTest, PinsLazilyChunkByChunk) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint64_t mib = 1 << 20;
  std::unique_ptr<ShmRegion> shm = MakeShm("lazy", 64 * mib);
  ASSERT_NE(shm, nullptr);
  std::unique_ptr<PinnedMapping> m =
      *PinnedMapping::Create(shm->data(), shm->size(), {.chunk_bytes = 4 * mib});
  EXPECT_EQ(m->pinned_bytes(), 0u);
  ASSERT_TRUE(m->EnsurePinned(5 * mib, mib).ok());
  EXPECT_EQ(m->pinned_bytes(), 4 * mib);
  EXPECT_TRUE(m->IsPinned(4 * mib, 4 * mib));
  EXPECT_FALSE(m->IsPinned(0, 1));
  ASSERT_TRUE(m->EnsurePinned(7 * mib, 2 * mib).ok());  // spans chunks 1 and 2
  EXPECT_EQ(m->pinned_bytes(), 8 * mib);
  cudaPointerAttributes attr{};
  ASSERT_CUDA_OK(cudaPointerGetAttributes(&attr, shm->data() + 9 * mib));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(m->EnsurePinned(60 * mib, 8 * mib).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(m->PinAll().ok());
  EXPECT_EQ(m->pinned_bytes(), 64 * mib);
}

TEST(PinnedMappingGpuTest, PinsAWorkerPagePool) {
  KVTIER_SKIP_WITHOUT_GPU();
  std::unique_ptr<HostPagePool> pool = *HostPagePool::Create(PoolKind::kDdr, 8 << 20);
  std::unique_ptr<PinnedMapping> m =
      *PinnedMapping::ForPool(*pool, {.chunk_bytes = 1 << 20, .pin_all_now = true});
  EXPECT_EQ(m->pinned_bytes(), pool->size());
  EXPECT_EQ(m->base(), pool->base());
}

TEST(PinnedMappingGpuTest, AnAlreadyPinnedPoolIsNeverRegisteredAgain) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint64_t mib = 1 << 20;
  std::unique_ptr<ShmRegion> shm = MakeShm("borrowed", 8 * mib);
  ASSERT_NE(shm, nullptr);
  std::unique_ptr<PinnedMapping> m = *PinnedMapping::Create(
      shm->data(), shm->size(), {.chunk_bytes = 4 * mib, .already_pinned = true});
  EXPECT_EQ(m->pinned_bytes(), 8 * mib);
  EXPECT_TRUE(m->IsPinned(0, 8 * mib));
  ASSERT_TRUE(m->EnsurePinned(0, 8 * mib).ok());
  // Nothing was registered: the runtime still sees plain pageable memory.
  cudaPointerAttributes attr{};
  ASSERT_CUDA_OK(cudaPointerGetAttributes(&attr, shm->data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
}

TEST(PinnedMappingGpuTest, RejectsBadArguments) {
  KVTIER_SKIP_WITHOUT_GPU();
  alignas(4096) static uint8_t buf[8192];
  EXPECT_EQ(PinnedMapping::Create(nullptr, 4096, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedMapping::Create(buf + 1, 4096, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedMapping::Create(buf, 8192, {.chunk_bytes = 1000}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PinnedMappingGpuTest, AsyncRoundTripThroughThePinnedMapping) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint64_t half = 8 << 20;
  std::unique_ptr<ShmRegion> shm = MakeShm("trip", 2 * half);
  ASSERT_NE(shm, nullptr);
  std::unique_ptr<PinnedMapping> m =
      *PinnedMapping::Create(shm->data(), shm->size(), {.chunk_bytes = half, .pin_all_now = true});
  std::mt19937 rng(9);
  for (uint64_t i = 0; i < half; ++i) shm->data()[i] = static_cast<uint8_t>(rng());
  DeviceBuffer<uint8_t> dev(half);
  cudaStream_t s;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_CUDA_OK(cudaMemcpyAsync(dev.get(), shm->data(), half, cudaMemcpyHostToDevice, s));
  ASSERT_CUDA_OK(cudaMemcpyAsync(shm->data() + half, dev.get(), half, cudaMemcpyDeviceToHost, s));
  ASSERT_CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(0, std::memcmp(shm->data(), shm->data() + half, half));
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace kvtier::worker::cuda
