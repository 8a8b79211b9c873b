#include "worker/cuda/range_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

absl::StatusOr<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be > 0, got 0");
  const uint64_t need = RoundUp(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + need, rest);
    live_.emplace(offset, need);
    used_ += need;
    return offset;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free range of ", need, " bytes (used ", used_, " of ", capacity_, ")"));
}

absl::Status RangeAllocator::Free(uint64_t offset) {
  auto live = live_.find(offset);
  if (live == live_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is not allocated"));
  }
  uint64_t begin = offset, bytes = live->second;
  used_ -= bytes;
  live_.erase(live);
  auto next = free_.lower_bound(begin);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && begin + bytes == next->first) {
    bytes += next->second;
    free_.erase(next);
  }
  free_.emplace(begin, bytes);
  return absl::OkStatus();
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [offset, bytes] : free_) best = std::max(best, bytes);
  return best;
}

}  // namespace kvtier::worker::cuda
