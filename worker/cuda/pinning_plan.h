#ifndef KVTIER_WORKER_CUDA_PINNING_PLAN_H_
#define KVTIER_WORKER_CUDA_PINNING_PLAN_H_

// How a large host pool is pinned: in fixed chunks, so start-up pins nothing (or a little) and
// each chunk is registered the first time a copy touches it. Pure arithmetic, no CUDA.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::worker::cuda {

inline constexpr uint64_t kHostPageBytes = 4096;

// Chunk i covers [i * chunk_bytes, min((i + 1) * chunk_bytes, size)).
struct PinChunk {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// INVALID_ARGUMENT when size or chunk_bytes is 0 or chunk_bytes is not a multiple of 4096.
absl::StatusOr<std::vector<PinChunk>> PlanPinChunks(uint64_t size, uint64_t chunk_bytes);

// Chunk indices [first, last] that [offset, offset + bytes) touches. REQUIRES: bytes > 0.
struct ChunkSpan {
  uint64_t first = 0;
  uint64_t last = 0;
};
inline ChunkSpan ChunksCovering(uint64_t offset, uint64_t bytes, uint64_t chunk_bytes) {
  return {offset / chunk_bytes, (offset + bytes - 1) / chunk_bytes};
}

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_PINNING_PLAN_H_
