#ifndef KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_
#define KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_

// T0 on the GPU: one cudaMalloc of the worker's HBM budget, carved into blocks by a first-fit
// range allocator. Follows the worker's DeviceArena contract (worker/device_arena.h on the worker
// branch; the base class is added when that header lands): Allocate returns a zero-filled,
// 256-byte aligned block (device memory, so host_accessible() is false).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/cuda/range_allocator.h"

namespace kvtier::worker::cuda {

inline constexpr uint64_t kArenaAlignment = 256;

// Thread-safe (several sequences share one arena).
class CudaDeviceArena final {
 public:
  // Allocates `capacity_bytes` on the current device. Zero fills run on `stream` (null = a
  // stream of the arena's own) and are waited for, so a block is zero when Allocate returns.
  // INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED when the device has not that much.
  static absl::StatusOr<std::unique_ptr<CudaDeviceArena>> Create(uint64_t capacity_bytes);
  ~CudaDeviceArena();
  CudaDeviceArena(const CudaDeviceArena&) = delete;
  CudaDeviceArena& operator=(const CudaDeviceArena&) = delete;

  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes);
  // REQUIRES: `block` came from Allocate(bytes) of this arena and is not freed yet.
  void Free(uint8_t* block, uint64_t bytes);
  uint64_t capacity_bytes() const;
  uint64_t used_bytes() const;
  uint64_t peak_bytes() const;
  bool host_accessible() const { return false; }

  uint8_t* device_base() const { return base_; }

 private:
  CudaDeviceArena(uint8_t* base, uint64_t capacity, cudaStream_t stream)
      : base_(base), stream_(stream), ranges_(capacity, kArenaAlignment) {}

  uint8_t* const base_;
  const cudaStream_t stream_;
  mutable absl::Mutex mu_;
  RangeAllocator ranges_ ABSL_GUARDED_BY(mu_);
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_CUDA_DEVICE_ARENA_H_
