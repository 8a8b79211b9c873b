#include "worker/cuda/pinning_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {

absl::StatusOr<std::vector<PinChunk>> PlanPinChunks(uint64_t size, uint64_t chunk_bytes) {
  if (size == 0) return absl::InvalidArgumentError("size must be > 0, got 0");
  if (chunk_bytes == 0 || chunk_bytes % kHostPageBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be a non-zero multiple of 4096, got ", chunk_bytes));
  }
  std::vector<PinChunk> chunks;
  chunks.reserve((size + chunk_bytes - 1) / chunk_bytes);
  for (uint64_t off = 0; off < size; off += chunk_bytes) {
    chunks.push_back({off, std::min(chunk_bytes, size - off)});
  }
  return chunks;
}

}  // namespace kvtier::worker::cuda
