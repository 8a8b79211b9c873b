// Pinning a shared-memory mapping in chunks, and DMA round trips through it.

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/cuda/shm_region.h"
#include "worker/runtime/daemon_pools.h"

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

// A daemon pool as the client maps it (client/lib/extent_mapping): a PROT_NONE reservation with
// memfd extents mapped from the front.
class ReservedPool final : public PoolMapping {
 public:
  ReservedPool(uint64_t extent, uint32_t max_extents) : extent_(extent), max_(max_extents) {
    void* p = mmap(nullptr, extent * max_extents, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~ReservedPool() override {
    if (base_ != nullptr) munmap(base_, extent_ * max_);
  }
  bool MapNext() {
    const int fd = memfd_create("kvtier-gpu-extent", MFD_CLOEXEC);
    const bool ok = fd >= 0 && ftruncate(fd, static_cast<off_t>(extent_)) == 0 &&
                    mmap(base_ + mapped_ * extent_, extent_, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED;
    if (fd >= 0) close(fd);
    mapped_ += ok;
    return ok;
  }
  v1::PoolKind kind() const override { return v1::POOL_KIND_DDR; }
  uint8_t* data() const override { return base_; }
  uint64_t data_bytes() const override { return extent_ * max_; }
  uint64_t extent_bytes() const override { return extent_; }
  uint64_t epoch() const override { return 1; }
  uint32_t mapped_extents() const override { return mapped_; }

 private:
  const uint64_t extent_;
  const uint32_t max_;
  uint8_t* base_ = nullptr;
  uint32_t mapped_ = 0;
};

// The daemon-mode worker over memfd pools: a mostly unmapped reservation of 12 MiB extents (not
// a power of two) with the default 256 MiB chunks. Registering a chunk would cover PROT_NONE
// memory, which the driver refuses; registrations per mapped extent work, copies go through
// them, a range past the mapped extents is refused without a CUDA call, and no error is left
// for the next launch to report.
TEST(PinnedMappingGpuTest, ADaemonPoolIsPinnedPerMappedExtent) {
  KVTIER_SKIP_WITHOUT_GPU();
  constexpr uint64_t kExtent = 12 << 20;
  auto mapping = std::make_shared<ReservedPool>(kExtent, 32);
  ASSERT_NE(mapping->data(), nullptr);
  ASSERT_TRUE(mapping->MapNext() && mapping->MapNext() && mapping->MapNext());
  std::unique_ptr<PagePool> pool = PoolOverMapping(PoolKind::kDdr, mapping);
  absl::StatusOr<std::unique_ptr<PinnedMapping>> m = PinnedMapping::ForPool(*pool, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->chunk_bytes(), kExtent);
  const uint64_t at = 2 * kExtent + 4096, bytes = 1 << 20;
  ASSERT_TRUE((*m)->EnsurePinned(at, bytes).ok());
  EXPECT_EQ((*m)->pinned_bytes(), kExtent);
  std::mt19937 rng(12);
  for (uint64_t i = 0; i < bytes; ++i) mapping->data()[at + i] = static_cast<uint8_t>(rng());
  DeviceBuffer<uint8_t> dev(bytes);
  cudaStream_t s;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_CUDA_OK(
      cudaMemcpyAsync(dev.get(), mapping->data() + at, bytes, cudaMemcpyHostToDevice, s));
  ASSERT_TRUE((*m)->EnsurePinned(0, bytes).ok());
  ASSERT_CUDA_OK(cudaMemcpyAsync(mapping->data(), dev.get(), bytes, cudaMemcpyDeviceToHost, s));
  ASSERT_CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(0, std::memcmp(mapping->data(), mapping->data() + at, bytes));
  cudaStreamDestroy(s);
  const absl::Status past = (*m)->EnsurePinned(3 * kExtent, 4096);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << past;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_TRUE(mapping->MapNext());  // the daemon grants extent 3
  EXPECT_TRUE((*m)->EnsurePinned(3 * kExtent, 4096).ok());
  m->reset();  // unpinned here, while the memory is still mapped
  cudaPointerAttributes attr{};
  ASSERT_CUDA_OK(cudaPointerGetAttributes(&attr, mapping->data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
}

}  // namespace
}  // namespace kvtier::worker::cuda
