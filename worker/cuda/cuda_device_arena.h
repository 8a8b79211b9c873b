#ifndef KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_
#define KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_

// T0 on the GPU: one cudaMalloc of the worker's HBM budget, carved into blocks by a first-fit
// range allocator. Implements the worker's DeviceArena: Allocate returns a 256-byte aligned block
// of unspecified contents (device memory, so host_accessible() is false); no call touches a
// stream or synchronizes.

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/range_allocator.h"
#include "worker/device_arena.h"

namespace kvtier::worker::cuda {

inline constexpr uint64_t kArenaAlignment = 256;

// Thread-safe (several sequences share one arena).
class CudaDeviceArena final : public DeviceArena {
 public:
  // Allocates `capacity_bytes` on the current device. INVALID_ARGUMENT for 0 bytes;
  // RESOURCE_EXHAUSTED when the device has not that much.
  static absl::StatusOr<std::unique_ptr<CudaDeviceArena>> Create(uint64_t capacity_bytes);
  ~CudaDeviceArena() override;
  CudaDeviceArena(const CudaDeviceArena&) = delete;
  CudaDeviceArena& operator=(const CudaDeviceArena&) = delete;

  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes) override;
  // REQUIRES: `block` came from Allocate(bytes) of this arena and is not freed yet.
  void Free(uint8_t* block, uint64_t bytes) override;
  uint64_t capacity_bytes() const override;
  uint64_t used_bytes() const override;
  uint64_t peak_bytes() const;
  bool host_accessible() const override { return false; }

  uint8_t* device_base() const { return base_; }

 private:
  CudaDeviceArena(uint8_t* base, uint64_t capacity)
      : base_(base), ranges_(capacity, kArenaAlignment) {}

  uint8_t* const base_;
  mutable absl::Mutex mu_;
  RangeAllocator ranges_ ABSL_GUARDED_BY(mu_);
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_
