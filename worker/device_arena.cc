#include "worker/device_arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::worker {

absl::StatusOr<uint8_t*> HostArena::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be positive, got 0");
  {
    absl::MutexLock lock(&mu_);
    if (used_ + bytes > capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat("device arena full: ", used_, " + ", bytes,
                                                       " > capacity ", capacity_, " bytes"));
    }
    used_ += bytes;
    peak_ = std::max(peak_, used_);
    auto it = cached_.find(bytes);
    if (it != cached_.end() && !it->second.empty()) {
      uint8_t* block = it->second.back();
      it->second.pop_back();
      return block;
    }
  }
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    absl::MutexLock lock(&mu_);
    used_ -= bytes;
    return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " failed"));
  }
  return static_cast<uint8_t*>(p);
}

void HostArena::Free(uint8_t* block, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
  cached_[bytes].push_back(block);
}

HostArena::~HostArena() {
  absl::MutexLock lock(&mu_);
  for (auto& [bytes, blocks] : cached_) {
    for (uint8_t* b : blocks) std::free(b);
  }
}

uint64_t HostArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t HostArena::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace kvtier::worker
