#include "daemon/slot_allocator.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "core/layout/shm_abi.h"

namespace kvtier::daemon {
namespace {

constexpr uint64_t kAlign = layout::kSlotAlignment;
uint64_t RoundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Slot& Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    offset_ = std::exchange(other.offset_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Slot::Reset() {
  if (owner_ != nullptr) owner_->Free(offset_, bytes_);
  owner_ = nullptr;
  offset_ = 0;
  bytes_ = 0;
}

SlotAllocator::SlotAllocator(uint64_t capacity, uint64_t base, int tag)
    : capacity_(capacity / kAlign * kAlign), base_(base), tag_(tag), free_bytes_(capacity_) {
  if (capacity_ > 0) AddFree(0, capacity_);
}

uint64_t SlotAllocator::largest_free_extent() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void SlotAllocator::AddFree(uint64_t offset, uint64_t bytes) {
  free_by_offset_.emplace(offset, bytes);
  free_by_size_.emplace(bytes, offset);
}

void SlotAllocator::RemoveFree(uint64_t offset, uint64_t bytes) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({bytes, offset});
}

absl::StatusOr<uint64_t> SlotAllocator::TakeExtent(uint64_t bytes) {
  auto it = free_by_size_.lower_bound({bytes, 0});  // best fit, lowest offset among equals
  if (it == free_by_size_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool full: no free extent of ", bytes, " bytes (largest ", largest_free_extent(), ")"));
  }
  auto [len, off] = *it;
  RemoveFree(off, len);
  if (len > bytes) AddFree(off + bytes, len - bytes);
  free_bytes_ -= bytes;
  return off;
}

void SlotAllocator::ReturnExtent(uint64_t offset, uint64_t bytes) {
  free_bytes_ += bytes;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && offset + bytes == next->first) {
    uint64_t len = next->second;
    RemoveFree(next->first, len);
    bytes += len;
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      uint64_t poff = prev->first, plen = prev->second;
      RemoveFree(poff, plen);
      offset = poff;
      bytes += plen;
    }
  }
  AddFree(offset, bytes);
}

bool SlotAllocator::CanAllocate(uint64_t bytes) const {
  if (bytes == 0 || bytes > capacity_) return false;
  const uint64_t slot = RoundUp(bytes);
  auto it = classes_.find(slot);
  return (it != classes_.end() && !it->second.partial.empty()) || largest_free_extent() >= slot;
}

absl::StatusOr<Slot> SlotAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot size ", bytes, " must be in [1, ", capacity_, "]"));
  }
  const uint64_t slot = RoundUp(bytes);
  SizeClass& cls = classes_[slot];
  if (cls.partial.empty()) {
    uint64_t k = std::max<uint64_t>(1, kExtentTarget / slot);
    // A short pool still serves slots: carve fewer per extent when the full extent won't fit.
    k = std::min(k, largest_free_extent() / slot);
    if (k == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pool full: no room for a ", slot, "-byte slot (", used_bytes_, " of ",
                       capacity_, " bytes used, largest free extent ", largest_free_extent(), ")"));
    }
    absl::StatusOr<uint64_t> taken = TakeExtent(k * slot);
    if (!taken.ok()) return taken.status();
    Extent& e = extents_[*taken];
    e.slot_bytes = slot;
    e.num_slots = static_cast<uint32_t>(k);
    e.in_use.assign(k, false);
    e.free_slots.resize(k);
    for (uint32_t i = 0; i < k; ++i) e.free_slots[i] = static_cast<uint32_t>(k - 1 - i);
    cls.partial.insert(*taken);
  }
  const uint64_t ext_off = *cls.partial.begin();
  Extent& e = extents_[ext_off];
  uint32_t idx = e.free_slots.back();
  e.free_slots.pop_back();
  e.in_use[idx] = true;
  ++e.used;
  if (e.free_slots.empty()) cls.partial.erase(ext_off);
  used_bytes_ += slot;
  ++slots_used_;
  return Slot(this, base_ + ext_off + uint64_t{idx} * slot, slot);
}

void SlotAllocator::Free(uint64_t offset, uint64_t bytes) {
  offset -= base_;
  auto it = extents_.upper_bound(offset);
  assert(it != extents_.begin());
  --it;
  Extent& e = it->second;
  const uint64_t ext_off = it->first;
  const uint32_t idx = static_cast<uint32_t>((offset - ext_off) / e.slot_bytes);
  assert(e.slot_bytes == bytes && idx < e.num_slots && e.in_use[idx]);
  e.in_use[idx] = false;
  e.free_slots.push_back(idx);
  --e.used;
  used_bytes_ -= bytes;
  --slots_used_;
  SizeClass& cls = classes_[e.slot_bytes];
  if (e.used == 0) {
    cls.partial.erase(ext_off);
    uint64_t ext_bytes = uint64_t{e.num_slots} * e.slot_bytes;
    extents_.erase(it);
    ReturnExtent(ext_off, ext_bytes);
  } else {
    cls.partial.insert(ext_off);
  }
}

absl::Status SlotAllocator::CheckInvariants() const {
  uint64_t used = 0, slots = 0, reserved = 0, free_total = 0;
  uint64_t prev_end = 0;
  // Extents and free ranges together must tile [0, capacity) without overlap.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [off, e] : extents_) {
    uint64_t len = uint64_t{e.num_slots} * e.slot_bytes;
    ranges.emplace_back(off, len);
    reserved += len;
    uint32_t in_use = 0;
    for (bool b : e.in_use) in_use += b ? 1 : 0;
    if (in_use != e.used || e.used + e.free_slots.size() != e.num_slots || e.used == 0) {
      return absl::InternalError(absl::StrCat("extent ", off, " bookkeeping is inconsistent"));
    }
    used += uint64_t{e.used} * e.slot_bytes;
    slots += e.used;
  }
  for (const auto& [off, len] : free_by_offset_) {
    ranges.emplace_back(off, len);
    free_total += len;
    if (!free_by_size_.count({len, off})) return absl::InternalError("free maps disagree");
  }
  if (free_by_size_.size() != free_by_offset_.size()) return absl::InternalError("free maps size");
  std::sort(ranges.begin(), ranges.end());
  for (const auto& [off, len] : ranges) {
    if (off != prev_end) return absl::InternalError(absl::StrCat("gap/overlap at ", off));
    prev_end = off + len;
  }
  if (prev_end != capacity_) return absl::InternalError("ranges do not cover the capacity");
  for (auto it = free_by_offset_.begin(); it != free_by_offset_.end(); ++it) {
    auto next = std::next(it);
    if (next != free_by_offset_.end() && it->first + it->second == next->first) {
      return absl::InternalError(absl::StrCat("free extents at ", it->first, " not coalesced"));
    }
  }
  if (used != used_bytes_ || slots != slots_used_ || free_total != free_bytes_ ||
      reserved + free_total != capacity_) {
    return absl::InternalError("byte accounting is inconsistent");
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
