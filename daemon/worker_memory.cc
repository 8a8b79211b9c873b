#include "daemon/worker_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"

namespace kvtier::daemon {

PoolBudget::PoolBudget(layout::PoolKind kind, uint64_t capacity, uint64_t extent_bytes,
                       std::string label, ExtentSource source)
    : kind_(kind),
      capacity_(capacity),
      extent_bytes_(extent_bytes),
      label_(std::move(label)),
      source_(std::move(source)) {}

absl::StatusOr<Extent> PoolBudget::MakeExtent(ExtentMemory memory) const {
  ExtentSource source = source_;
  source.memory = memory;
  return Extent::Make(label_, extent_bytes_, source);
}

absl::StatusOr<Extent> PoolBudget::Take(ExtentMemory memory) {
  if (!spares_.empty() && memory == source_.memory) {
    Extent e = std::move(spares_.back());
    spares_.pop_back();
    return e;
  }
  if (reserved_ + extent_bytes_ > capacity_) {
    last_failure_.clear();  // full by the budget's own count, not refused by the system
    return absl::ResourceExhaustedError(absl::StrCat(
        kind_ == layout::PoolKind::kDdr ? "DDR" : "compressed", " budget full: ", extents_out(),
        " extents of ", extent_bytes_, " bytes out of ", capacity_));
  }
  absl::StatusOr<Extent> extent = MakeExtent(memory);
  Note(extent.status());
  if (!extent.ok()) return extent.status();
  reserved_ += extent_bytes_;
  return extent;
}

void PoolBudget::Note(const absl::Status& made) {
  if (made.ok()) {
    last_failure_.clear();
    return;
  }
  // The extent size in force (pools.extent_mib, capped at a sixteenth of the budget).
  std::string memory = "memfd";
  if (source_.memory == ExtentMemory::kCudaVmm) {
    memory = absl::StrCat("CUDA VMM pinned on host NUMA node ", source_.numa_node);
  } else if (!source_.dir.empty()) {
    memory = absl::StrCat("pools.extent_dir = \"", source_.dir, "\"");
  }
  last_failure_ = absl::StrCat(made.message(), "; extents of ", extent_bytes_,
                               " bytes (pools.extent_mib), ", memory);
}

void PoolBudget::Return(uint64_t bytes) { reserved_ -= bytes; }

void PoolBudget::EndSpare(absl::StatusOr<Extent> extent) {
  --making_;
  Note(extent.status());
  if (extent.ok()) {
    spares_.push_back(*std::move(extent));
  } else {
    reserved_ -= extent_bytes_;
  }
}

WorkerMemory::WorkerMemory(PoolBudget* budget, int tag, uint64_t max_extents, Extent header,
                           ExtentMemory memory)
    : budget_(budget),
      tag_(tag),
      max_extents_(max_extents),
      memory_(memory),
      header_(std::move(header)) {}

WorkerMemory::~WorkerMemory() {
  for (const auto& held : extents_) budget_->Return(held->extent.bytes());
}

absl::StatusOr<Slot> WorkerMemory::Allocate(uint64_t bytes) {
  for (const auto& held : extents_) {
    if (held->slots.CanAllocate(bytes)) return held->slots.Allocate(bytes);
  }
  if (extents_.size() >= max_extents_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("worker holds its most extents (", max_extents_, ")"));
  }
  ASSIGN_OR_RETURN(Extent extent, budget_->Take(memory_));
  Adopt(std::move(extent));
  return extents_.back()->slots.Allocate(bytes);
}

void WorkerMemory::Adopt(Extent extent) {
  const uint64_t base = extents_.size() * budget_->extent_bytes();
  extents_.push_back(std::unique_ptr<Held>(
      new Held{std::move(extent), SlotAllocator(budget_->extent_bytes(), base, tag_)}));
}

std::vector<Extent> WorkerMemory::TakeExtents() {
  std::vector<Extent> out;
  out.reserve(extents_.size());
  for (auto& held : extents_) out.push_back(std::move(held->extent));
  extents_.clear();
  return out;
}

uint64_t WorkerMemory::ExtentsWanted(uint64_t slots, uint64_t bytes) const {
  const uint64_t slot =
      (bytes + layout::kSlotAlignment - 1) / layout::kSlotAlignment * layout::kSlotAlignment;
  if (slot == 0 || slot > budget_->extent_bytes()) return 0;
  uint64_t fit = 0;
  for (const auto& held : extents_) {
    fit += (held->slots.capacity() - held->slots.used_bytes()) / slot;
  }
  if (fit >= slots) return 0;
  const uint64_t per_extent = budget_->extent_bytes() / slot;
  const uint64_t wanted = (slots - fit + per_extent - 1) / per_extent;
  return std::min<uint64_t>(wanted, max_extents_ - extents_.size());
}

absl::Status WorkerMemory::CheckInvariants() const {
  for (const auto& held : extents_) RETURN_IF_ERROR(held->slots.CheckInvariants());
  return absl::OkStatus();
}

}  // namespace kvtier::daemon
