#include "worker/cuda/pinned_mapping.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/pinning_plan.h"

namespace kvtier::worker::cuda {

absl::StatusOr<std::unique_ptr<PinnedMapping>> PinnedMapping::Create(uint8_t* base, uint64_t size,
                                                                     PinnedMappingOptions options) {
  if (base == nullptr) return absl::InvalidArgumentError("base is null");
  if (reinterpret_cast<uintptr_t>(base) % kHostPageBytes != 0) {
    return absl::InvalidArgumentError("base must be 4096-byte aligned");
  }
  absl::StatusOr<std::vector<PinChunk>> chunks = PlanPinChunks(size, options.chunk_bytes);
  if (!chunks.ok()) return chunks.status();
  std::unique_ptr<PinnedMapping> m(
      new PinnedMapping(base, size, options.chunk_bytes, chunks->size(), options.already_pinned));
  if (options.pin_all_now) {
    absl::Status s = m->PinAll();
    if (!s.ok()) return s;
  }
  return m;
}

PinnedMapping::~PinnedMapping() {
  if (borrowed_) return;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < pinned_.size(); ++i) {
    if (pinned_[i]) cudaHostUnregister(base_ + i * chunk_bytes_);
  }
}

absl::Status PinnedMapping::EnsurePinned(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("range [", offset, ", +", bytes, ") leaves the mapping of ", size_));
  }
  const ChunkSpan span = ChunksCovering(offset, bytes, chunk_bytes_);
  absl::MutexLock lock(&mu_);
  for (uint64_t i = span.first; i <= span.last; ++i) {
    if (pinned_[i]) continue;
    const uint64_t begin = i * chunk_bytes_;
    const uint64_t n = std::min(chunk_bytes_, size_ - begin);
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaHostRegister(base_ + begin, n, cudaHostRegisterPortable | cudaHostRegisterMapped));
    pinned_[i] = true;
  }
  return absl::OkStatus();
}

bool PinnedMapping::IsPinned(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0) return true;
  if (offset > size_ || bytes > size_ - offset) return false;
  const ChunkSpan span = ChunksCovering(offset, bytes, chunk_bytes_);
  absl::MutexLock lock(&mu_);
  for (uint64_t i = span.first; i <= span.last; ++i) {
    if (!pinned_[i]) return false;
  }
  return true;
}

uint64_t PinnedMapping::pinned_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (size_t i = 0; i < pinned_.size(); ++i) {
    if (pinned_[i]) total += std::min(chunk_bytes_, size_ - i * chunk_bytes_);
  }
  return total;
}

}  // namespace kvtier::worker::cuda
