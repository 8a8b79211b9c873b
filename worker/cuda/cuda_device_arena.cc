#include "worker/cuda/cuda_device_arena.h"

#include <algorithm>

#include "worker/cuda/cuda_status.h"

namespace kvtier::worker::cuda {

absl::StatusOr<std::unique_ptr<CudaDeviceArena>> CudaDeviceArena::Create(uint64_t capacity_bytes) {
  if (capacity_bytes < kArenaAlignment) {
    return absl::InvalidArgumentError("capacity_bytes must be >= 256");
  }
  void* base = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&base, capacity_bytes));
  return std::unique_ptr<CudaDeviceArena>(
      new CudaDeviceArena(static_cast<uint8_t*>(base), capacity_bytes));
}

CudaDeviceArena::~CudaDeviceArena() { cudaFree(base_); }

absl::StatusOr<uint8_t*> CudaDeviceArena::Allocate(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<uint64_t> offset = ranges_.Allocate(bytes);
  if (!offset.ok()) return offset.status();
  peak_ = std::max(peak_, ranges_.used());
  return base_ + *offset;
}

void CudaDeviceArena::Free(uint8_t* block, uint64_t /*bytes*/) {
  absl::MutexLock lock(&mu_);
  ranges_.Free(static_cast<uint64_t>(block - base_)).IgnoreError();
}

uint64_t CudaDeviceArena::capacity_bytes() const {
  absl::MutexLock lock(&mu_);
  return ranges_.capacity();
}

uint64_t CudaDeviceArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return ranges_.used();
}

uint64_t CudaDeviceArena::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace kvtier::worker::cuda
