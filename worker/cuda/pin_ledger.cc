#include "worker/cuda/pin_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/cuda/pinning_plan.h"

namespace kvtier::worker::cuda {

absl::StatusOr<uint64_t> PinUnitBytes(uint64_t size, uint64_t extent_bytes, uint64_t chunk_bytes) {
  if (size == 0) return absl::InvalidArgumentError("pool size must be > 0, got 0");
  if (chunk_bytes == 0 || chunk_bytes % kHostPageBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be a non-zero multiple of 4096, got ", chunk_bytes));
  }
  if (extent_bytes == 0 || size % extent_bytes != 0 ||
      (extent_bytes != size && extent_bytes % kHostPageBytes != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("extent_bytes ", extent_bytes,
                                                   " must be a multiple of 4096 dividing the "
                                                   "pool size ",
                                                   size));
  }
  if (extent_bytes == size) return chunk_bytes;  // one extent: chunks, the last one short
  // The largest multiple of 4096 that divides the extent and is at most a chunk.
  const uint64_t pages = extent_bytes / kHostPageBytes;
  for (uint64_t parts = (extent_bytes + chunk_bytes - 1) / chunk_bytes; parts <= pages; ++parts) {
    if (pages % parts == 0) return extent_bytes / parts;
  }
  return kHostPageBytes;
}

absl::StatusOr<std::unique_ptr<PinLedger>> PinLedger::Create(uint64_t size, uint64_t extent_bytes,
                                                             uint64_t chunk_bytes, PinHooks hooks,
                                                             bool borrowed) {
  absl::StatusOr<uint64_t> unit = PinUnitBytes(size, extent_bytes, chunk_bytes);
  if (!unit.ok()) return unit.status();
  return std::unique_ptr<PinLedger>(
      new PinLedger(size, extent_bytes, *unit, std::move(hooks), borrowed));
}

absl::Status PinLedger::EnsurePinned(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("range [", offset, ", +", bytes, ") leaves the pool of ", size_));
  }
  const ChunkSpan span = ChunksCovering(offset, bytes, unit_);
  absl::MutexLock lock(&mu_);
  if (borrowed_) return absl::OkStatus();
  const uint64_t mapped = hooks_.mapped_bytes ? hooks_.mapped_bytes() : size_;
  for (uint64_t i = span.first; i <= span.last; ++i) {
    if (pinned_[i]) continue;
    const uint64_t begin = i * unit_, n = UnitBytes(i);
    if (begin + n > mapped) {
      return absl::FailedPreconditionError(absl::StrCat(
          "range [", offset, ", +", bytes, ") reaches past the ", mapped / extent_,
          " mapped extents of ", extent_, " bytes: not pinned (unmapped memory cannot be)"));
    }
    if (absl::Status s = hooks_.pin(begin, n); !s.ok()) return s;
    pinned_[i] = true;
  }
  return absl::OkStatus();
}

bool PinLedger::IsPinned(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0) return true;
  if (offset > size_ || bytes > size_ - offset) return false;
  const ChunkSpan span = ChunksCovering(offset, bytes, unit_);
  absl::MutexLock lock(&mu_);
  for (uint64_t i = span.first; i <= span.last; ++i) {
    if (!pinned_[i]) return false;
  }
  return true;
}

void PinLedger::ReleaseAll() {
  absl::MutexLock lock(&mu_);
  if (borrowed_) return;
  for (uint64_t i = 0; i < pinned_.size(); ++i) {
    if (pinned_[i]) hooks_.unpin(i * unit_);
    pinned_[i] = false;
  }
}

uint64_t PinLedger::pinned_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (uint64_t i = 0; i < pinned_.size(); ++i) total += pinned_[i] ? UnitBytes(i) : 0;
  return total;
}

}  // namespace kvtier::worker::cuda
