#include "worker/page_pool.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"

namespace kvtier::worker {
namespace {

constexpr uint64_t kHostPoolAlignment = 4096;

uint64_t RoundUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

absl::StatusOr<std::unique_ptr<HostPagePool>> HostPagePool::Create(PoolKind kind, uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("size must be positive, got 0");
  // Anonymous mappings are page aligned and zero-filled lazily by the kernel.
  void* p = mmap(nullptr, RoundUp(size, kHostPoolAlignment), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map a host pool of ", size, " bytes"));
  }
  // Huge pages, as the T0 arena: attention reads T1 slots in place, a layer's K and V rows of
  // a slot at a time, and with 4 KiB pages every such run costs TLB misses that T0 pages do
  // not (advisory: ignored where THP is off).
  madvise(p, RoundUp(size, kHostPoolAlignment), MADV_HUGEPAGE);
  return std::unique_ptr<HostPagePool>(new HostPagePool(kind, static_cast<uint8_t*>(p), size));
}

HostPagePool::~HostPagePool() { munmap(base_, RoundUp(size_, kHostPoolAlignment)); }

LocalSlotAllocator::LocalSlotAllocator(const std::vector<PoolSpec>& pools) {
  absl::MutexLock lock(&mu_);
  for (const PoolSpec& spec : pools) {
    Region& r = regions_[static_cast<uint32_t>(spec.kind)];
    r.size = spec.size;
    r.cursor = RoundUp(spec.data_begin, layout::kSlotAlignment);
  }
}

absl::StatusOr<LocalSlotAllocator::Region*> LocalSlotAllocator::FindRegion(PoolKind kind) {
  auto it = regions_.find(static_cast<uint32_t>(kind));
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: no pool of kind ", static_cast<uint32_t>(kind), " is registered"));
  }
  return &it->second;
}

absl::StatusOr<uint64_t> LocalSlotAllocator::AllocateSlot(PoolKind kind, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be positive, got 0");
  absl::MutexLock lock(&mu_);
  auto region = FindRegion(kind);
  if (!region.ok()) return region.status();
  Region& r = **region;
  const uint64_t size_class = RoundUp(bytes, layout::kSlotAlignment);
  uint64_t offset = 0;
  auto free_it = r.free_by_class.find(size_class);
  if (free_it != r.free_by_class.end() && !free_it->second.empty()) {
    offset = free_it->second.back();
    free_it->second.pop_back();
  } else if (r.cursor + size_class <= r.size) {
    offset = r.cursor;
    r.cursor += size_class;
  } else {
    return absl::ResourceExhaustedError(
        absl::StrCat("pool of kind ", static_cast<uint32_t>(kind), " is full: no slot of ",
                     size_class, " bytes (", r.granted_bytes, " of ", r.size, " granted)"));
  }
  r.class_of_granted[offset] = size_class;
  r.granted_bytes += size_class;
  return offset;
}

absl::Status LocalSlotAllocator::Free(PoolKind kind, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto region = FindRegion(kind);
  if (!region.ok()) return region.status();
  Region& r = **region;
  auto it = r.class_of_granted.find(offset);
  if (it == r.class_of_granted.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", offset, " is not a granted slot of pool kind ", static_cast<uint32_t>(kind)));
  }
  r.free_by_class[it->second].push_back(offset);
  r.granted_bytes -= it->second;
  r.class_of_granted.erase(it);
  return absl::OkStatus();
}

uint64_t LocalSlotAllocator::GrantedBytes(PoolKind kind) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(static_cast<uint32_t>(kind));
  return it == regions_.end() ? 0 : it->second.granted_bytes;
}

uint64_t LocalSlotAllocator::GrantedSlots(PoolKind kind) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(static_cast<uint32_t>(kind));
  return it == regions_.end() ? 0 : it->second.class_of_granted.size();
}

}  // namespace kvtier::worker
