#include "worker/device_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::worker {

namespace {

constexpr uint64_t kSlabBytes = uint64_t{64} << 20;
constexpr uint64_t kHugePage = uint64_t{2} << 20;
constexpr uint64_t kBlockAlignment = 64;

uint64_t RoundUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// Anonymous memory advised for huge pages; null on failure.
uint8_t* MapHuge(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where THP is off
  return static_cast<uint8_t*>(p);
}

}  // namespace

absl::StatusOr<uint8_t*> HostArena::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be positive, got 0");
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ + bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("device arena full: ", used_, " + ", bytes,
                                                     " > capacity ", capacity_, " bytes"));
  }
  uint8_t* block = nullptr;
  if (auto it = cached_.find(bytes); it != cached_.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
  } else {
    const uint64_t need = RoundUp(bytes, kBlockAlignment);
    if (slabs_.empty() || slab_used_ + need > slabs_.back().size) {
      const uint64_t size = RoundUp(std::max(kSlabBytes, need), kHugePage);
      uint8_t* base = MapHuge(size);
      if (base == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot map a slab of ", size, " bytes"));
      }
      slabs_.push_back({base, size});
      slab_used_ = 0;
    }
    block = slabs_.back().base + slab_used_;
    slab_used_ += need;
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return block;
}

void HostArena::Free(uint8_t* block, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  used_ -= bytes;
  cached_[bytes].push_back(block);
}

HostArena::~HostArena() {
  for (const Slab& s : slabs_) munmap(s.base, s.size);
}

uint64_t HostArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const Slab& s : slabs_) n += s.size;
  return n;
}

uint64_t HostArena::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t HostArena::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace kvtier::worker
