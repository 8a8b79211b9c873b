#ifndef KVTIER_WORKER_CUDA_RANGE_ALLOCATOR_H_
#define KVTIER_WORKER_CUDA_RANGE_ALLOCATOR_H_

// First-fit allocator of byte ranges inside one fixed region (the device arena's single
// cudaMalloc). Free ranges are kept sorted and coalesced. Pure logic, no CUDA.

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"

namespace kvtier::worker::cuda {

// Not thread-safe; CudaDeviceArena serializes calls.
class RangeAllocator {
 public:
  // `alignment` is a power of two; every offset and rounded size is a multiple of it.
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  // Offset of a free range of at least `bytes` (rounded up to the alignment).
  // INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED when no free range is large enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // INVALID_ARGUMENT when `offset` is not a live allocation.
  absl::Status Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;
  uint64_t RoundUp(uint64_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }

 private:
  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, disjoint, never adjacent
  std::map<uint64_t, uint64_t> live_;  // offset -> rounded bytes
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_RANGE_ALLOCATOR_H_
