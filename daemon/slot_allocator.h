#ifndef KVTIER_DAEMON_SLOT_ALLOCATOR_H_
#define KVTIER_DAEMON_SLOT_ALLOCATOR_H_

// Slots of a pool's data area, for pages of several sizes at once (workers may run different
// models). Design:
//  - a request is rounded up to a multiple of kSlotAlignment: its size class;
//  - a class carves slots out of extents of k slots, k = max(1, kExtentTarget / slot), taken from
//    a best-fit free-extent map (offset-ordered + size-ordered, coalescing on return);
//  - each class allocates from its lowest-address extent with a free slot (compacting), and an
//    extent goes back to the free map as soon as it is empty.
// Every operation is O(log n) in the number of extents. Fragmentation is bounded in the sense
// that matters for a non-moving allocator: a class opens a new extent only when all of its
// extents are full, reuses its lowest-address partial extent first (so churn compacts towards
// low addresses and empties high extents), and hands an extent back the moment it is empty; a
// short pool carves smaller extents rather than fail while a slot still fits. Slack
// (reserved_bytes - used_bytes) is what was freed and not yet reused; the randomized churn test
// keeps it under half of the used bytes.
// Slot offsets are base + a multiple of kSlotAlignment.

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::daemon {

class SlotAllocator;

// A move-only slot grant: frees itself on destruction. A default-constructed Slot is empty.
// Must not outlive its allocator. Not thread-safe on its own: the allocator's owner serializes.
class Slot {
 public:
  Slot() = default;
  Slot(Slot&& other) noexcept { *this = std::move(other); }
  Slot& operator=(Slot&& other) noexcept;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() { Reset(); }

  bool valid() const { return owner_ != nullptr; }
  uint64_t offset() const { return offset_; }
  uint64_t bytes() const { return bytes_; }  // rounded to kSlotAlignment
  const SlotAllocator* allocator() const { return owner_; }
  // Frees the slot now (no-op when empty).
  void Reset();

 private:
  friend class SlotAllocator;
  Slot(SlotAllocator* owner, uint64_t offset, uint64_t bytes)
      : owner_(owner), offset_(offset), bytes_(bytes) {}
  SlotAllocator* owner_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t bytes_ = 0;
};

// Thread-compatible: the owner (the daemon core, under its mutex) serializes all calls,
// including Slot destruction.
class SlotAllocator {
 public:
  // Extents hold about this many bytes (or one slot when a slot is larger).
  static constexpr uint64_t kExtentTarget = 2ull << 20;

  // `capacity` bytes of slot space, rounded down to kSlotAlignment. Slot offsets start at `base`
  // (a worker's extent i hands out offsets from i * extent_bytes); `tag` is the owner's label
  // for the allocator (the pool it serves).
  explicit SlotAllocator(uint64_t capacity, uint64_t base = 0, int tag = 0);
  SlotAllocator(const SlotAllocator&) = delete;
  SlotAllocator& operator=(const SlotAllocator&) = delete;
  // REQUIRES: every Slot has been released.
  ~SlotAllocator() = default;

  // A slot of at least `bytes` (> 0). RESOURCE_EXHAUSTED when no space is left,
  // INVALID_ARGUMENT for 0 or more than the capacity.
  absl::StatusOr<Slot> Allocate(uint64_t bytes);
  // Whether Allocate(bytes) would succeed (cheap: no status is built).
  bool CanAllocate(uint64_t bytes) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t base() const { return base_; }
  int tag() const { return tag_; }
  // Bytes of granted slots (rounded sizes).
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t slots_used() const { return slots_used_; }
  // Bytes held by extents (granted slots + slack inside partly used extents).
  uint64_t reserved_bytes() const { return capacity_ - free_bytes_; }
  // Largest contiguous free extent (what a new size class could still get).
  uint64_t largest_free_extent() const;
  size_t num_extents() const { return extents_.size(); }
  size_t num_free_extents() const { return free_by_offset_.size(); }
  // Checks every internal invariant (tests and the fuzzer): accounting, no overlap, coalescing.
  absl::Status CheckInvariants() const;

 private:
  friend class Slot;
  struct Extent {
    uint64_t slot_bytes = 0;
    uint32_t num_slots = 0;
    uint32_t used = 0;
    std::vector<uint32_t> free_slots;  // indices, LIFO
    std::vector<bool> in_use;
  };
  struct SizeClass {
    std::set<uint64_t> partial;  // extent offsets with a free slot, lowest first
  };

  void Free(uint64_t offset, uint64_t bytes);
  absl::StatusOr<uint64_t> TakeExtent(uint64_t bytes);
  void ReturnExtent(uint64_t offset, uint64_t bytes);
  void AddFree(uint64_t offset, uint64_t bytes);
  void RemoveFree(uint64_t offset, uint64_t bytes);

  uint64_t capacity_;
  uint64_t base_;
  int tag_;
  uint64_t free_bytes_;
  uint64_t used_bytes_ = 0;
  uint64_t slots_used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
  std::map<uint64_t, Extent> extents_;                    // offset -> extent
  absl::flat_hash_map<uint64_t, SizeClass> classes_;      // slot bytes -> class
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SLOT_ALLOCATOR_H_
