// TieredKvStore: plan validation and execution.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {
namespace {

std::string TierStr(tiering::Tier t) { return std::string(tiering::TierName(t)); }

using tiering::Move;
using tiering::Tier;

std::string PageName(const Move& m) {
  return absl::StrCat("page (group ", m.group, ", page ", m.page, ")");
}

}  // namespace

uint32_t TieredKvStore::ValidRows(uint32_t group, uint32_t page) const {
  const uint64_t begin = geometry_.PageBegin(page);
  const uint32_t length = lengths_[geometry_.GroupBegin(group)];
  return static_cast<uint32_t>(std::min<uint64_t>(geometry_.page_tokens, length - begin));
}

absl::Status TieredKvStore::ValidateMoveTiers(const Move& m, size_t i, uint32_t pages,
                                              bool partial_tail) const {
  auto at = [i] { return absl::StrCat("moves[", i, "]"); };
  const Tier current = pages_[m.group][m.page].tier;
  if (m.from != current) {
    return absl::InvalidArgumentError(absl::StrCat(at(), ".from (", TierStr(m.from), ") but ",
                                                   PageName(m), " is in ", TierStr(current)));
  }
  if (m.from == Tier::kT3) {
    return absl::InvalidArgumentError(
        absl::StrCat(at(), ".from: ", PageName(m), " is evicted (T3) and never comes back"));
  }
  if (m.to == m.from || static_cast<int>(m.to) >= tiering::kNumTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat(at(), ".to (", TierStr(m.to), ") must be another tier than from"));
  }
  if ((m.to == Tier::kT1 || m.to == Tier::kT2) && PoolOf(m.to) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(at(), ".to (", TierStr(m.to), "): the store has no pool for that tier"));
  }
  if (partial_tail && m.page + 1 == pages) {
    // The page being written: appends reach T0 and, on the host backend only, T1 in place.
    if (!backend_->host_t0()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), ".to (", TierStr(m.to), "): ", PageName(m),
                       " is the partial page being written; on this backend it stays in T0"));
    }
    if (m.to == Tier::kT2 || m.to == Tier::kT3) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), ".to (", TierStr(m.to), "): ", PageName(m),
                       " is the partial page being written; it may only move between T0 and T1"));
    }
  }
  return absl::OkStatus();
}

absl::Status TieredKvStore::ValidatePlan(const std::vector<Move>& moves,
                                         const std::vector<SlotAssignment>& slots) const {
  if (slots.size() != moves.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slots.size() (", slots.size(), ") must equal moves.size() (", moves.size(), ")"));
  }
  for (uint32_t layer = 1; layer < lengths_.size(); ++layer) {
    if (lengths_[layer] != lengths_[0]) {
      return absl::FailedPreconditionError(
          absl::StrCat("layers differ in length (layer 0: ", lengths_[0], ", layer ", layer, ": ",
                       lengths_[layer], "): plans apply between forward passes"));
    }
  }
  const uint32_t pages = num_pages();
  const bool partial_tail = lengths_[0] % geometry_.page_tokens != 0;
  absl::flat_hash_map<uint64_t, size_t> seen;
  seen.reserve(moves.size());
  // Blocks held for copies in flight come back before a promotion needs them (AllocateBlock).
  int64_t arena_used =
      static_cast<int64_t>(memory_.arena->used_bytes() - fence_.held_block_bytes());
  const int64_t arena_capacity = static_cast<int64_t>(memory_.arena->capacity_bytes());
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    auto at = [i] { return absl::StrCat("moves[", i, "]"); };
    if (m.group >= geometry_.layer_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          at(), ".group (", m.group, ") out of range [0, ", geometry_.layer_groups, ")"));
    }
    if (m.page >= pages) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), ".page (", m.page, ") out of range [0, ", pages, ")"));
    }
    auto [it, fresh] = seen.emplace(uint64_t{m.group} << 32 | m.page, i);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(at(), ": duplicate ", PageName(m),
                                                     ", first moved by moves[", it->second, "]"));
    }
    RETURN_IF_ERROR(ValidateMoveTiers(m, i, pages, partial_tail));
    const int64_t bytes = static_cast<int64_t>(geometry_.PageBytes(m.group));
    if (m.from == Tier::kT0) arena_used -= bytes;
    if (m.to == Tier::kT0) {
      arena_used += bytes;
      if (arena_used > arena_capacity) {
        return absl::ResourceExhaustedError(
            absl::StrCat(at(), ": promoting ", PageName(m), " would take the device arena to ",
                         arena_used, " bytes, over its capacity of ", arena_capacity));
      }
    }
  }
  return ValidateSlots(moves, slots);
}

absl::Status TieredKvStore::ValidateSlots(const std::vector<Move>& moves,
                                          const std::vector<SlotAssignment>& slots) const {
  // Destinations must not overlap a slot held now (sources are freed only after the plan is
  // acknowledged) nor each other.
  struct Interval {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Interval> dst[2];
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    if (m.to != Tier::kT1 && m.to != Tier::kT2) continue;
    const int pool = m.to == Tier::kT1 ? 0 : 1;
    const uint64_t off = slots[i].dst_offset;
    const uint64_t bytes = SlotBytes(pool == 0 ? PoolKind::kDdr : PoolKind::kCompressed, m.group);
    const uint64_t pool_size = PoolOf(m.to)->size();
    if (off % layout::kSlotAlignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slots[", i, "].dst_offset (", off, ") must be a multiple of ", layout::kSlotAlignment));
    }
    if (off > pool_size || bytes > pool_size - off) {
      return absl::InvalidArgumentError(absl::StrCat("slots[", i, "].dst_offset (", off, ") + ",
                                                     bytes, " bytes exceeds the ", TierStr(m.to),
                                                     " pool size (", pool_size, ")"));
    }
    auto next = held_[pool].upper_bound(off);
    const bool hits_prev = next != held_[pool].begin() && std::prev(next)->second > off;
    const bool hits_next = next != held_[pool].end() && next->first < off + bytes;
    if (hits_prev || hits_next) {
      const uint64_t other = hits_prev ? std::prev(next)->first : next->first;
      return absl::InvalidArgumentError(absl::StrCat("slots[", i, "].dst_offset (", off,
                                                     ") overlaps a slot the store already holds"
                                                     " at offset ",
                                                     other));
    }
    dst[pool].push_back({off, off + bytes, i});
  }
  for (auto& list : dst) {
    std::sort(list.begin(), list.end(),
              [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    for (size_t j = 1; j < list.size(); ++j) {
      if (list[j].begin >= list[j - 1].end) continue;
      const Interval& a = list[j - 1].index < list[j].index ? list[j - 1] : list[j];
      const Interval& b = list[j - 1].index < list[j].index ? list[j] : list[j - 1];
      return absl::InvalidArgumentError(absl::StrCat("slots[", b.index, "].dst_offset (", b.begin,
                                                     ") overlaps slots[", a.index, "] at offset ",
                                                     a.begin));
    }
  }
  return absl::OkStatus();
}

absl::Status TieredKvStore::ExecuteMove(const Move& m, const SlotAssignment& slot,
                                        std::vector<ReleasedSlot>* released) {
  PageEntry& e = pages_[m.group][m.page];
  const uint64_t page_bytes = geometry_.PageBytes(m.group);
  uint64_t written = 0;
  // 0. The only step that can fail, before anything changes: validated against the arena's
  // capacity, but an arena shared with other sequences may have filled up meanwhile.
  uint8_t* new_t0 = nullptr;
  if (m.to == Tier::kT0) {
    ASSIGN_OR_RETURN(new_t0, AllocateBlock(page_bytes));
  }
  // 1. Write the destination from the source's current bytes.
  uint8_t* dst = m.to == Tier::kT0   ? new_t0
                 : m.to == Tier::kT3 ? nullptr
                                     : PoolOf(m.to)->base() + slot.dst_offset;
  const uint32_t rows = ValidRows(m.group, m.page);
  absl::Status copied;
  if (m.to == Tier::kT2) {
    copied = backend_->EncodePage(m.from, PageBytes(m.group, m.page), m.group, rows, dst);
    written = CompressedSlotBytes(*codec_, geometry_, m.group);
  } else if (dst != nullptr) {
    copied = m.from == Tier::kT2
                 ? backend_->DecodePage(memory_.compressed_pool->base() + e.slot, m.group,
                                        e.compressed_rows, m.to, dst)
                 : backend_->CopyPage(m.from, PageBytes(m.group, m.page), m.to, dst, page_bytes);
    written = page_bytes;
  }
  if (!copied.ok()) {
    if (new_t0 != nullptr) FreeBlock(new_t0, page_bytes);
    return copied;
  }
  if (m.to == Tier::kT2) {
    e.compressed_rows = rows;
    e.lossy = true;
  }
  // 2. Release the source once the copy that reads it has landed.
  const CopyToken token = backend_->LastToken();
  if (m.from == Tier::kT0) {
    fence_.HoldBlock(token, e.t0, page_bytes,
                     [this](uint8_t* block, uint64_t bytes) { FreeBlock(block, bytes); });
    e.t0 = nullptr;
  } else {
    held_[m.from == Tier::kT1 ? 0 : 1].erase(e.slot);
    const ReleasedSlot source{m.from == Tier::kT1 ? PoolKind::kDdr : PoolKind::kCompressed, e.slot};
    // Held even when the caller does not collect `released`: the daemon frees the slot once it
    // has the ack, which goes out when ApplyPlan returns.
    if (token != kNoCopyPending) {
      fence_.HoldSlot(token, source);
    } else if (released != nullptr) {
      released->push_back(source);
    }
  }
  if (m.from == Tier::kT2) backend_->Forget(m.group, m.page);
  // 3. Point the page table at the new copy.
  e.tier = m.to;
  e.t0 = new_t0;
  e.slot = (m.to == Tier::kT1 || m.to == Tier::kT2) ? slot.dst_offset : 0;
  if (m.to == Tier::kT1 || m.to == Tier::kT2) {
    const int pool = m.to == Tier::kT1 ? 0 : 1;
    held_[pool][e.slot] =
        e.slot + SlotBytes(pool == 0 ? PoolKind::kDdr : PoolKind::kCompressed, m.group);
  }
  ++e.version;
  const int from = static_cast<int>(m.from), to = static_cast<int>(m.to);
  stats_.move_bytes[from][to] += written;
  ++stats_.move_count[from][to];
  return absl::OkStatus();
}

absl::Status TieredKvStore::ApplyPlan(const std::vector<Move>& moves,
                                      const std::vector<SlotAssignment>& slots,
                                      std::vector<ReleasedSlot>* released) {
  if (absl::Status s = ValidatePlan(moves, slots); !s.ok()) {
    ++stats_.plans_rejected;
    return s;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  size_t failed = moves.size();
  for (size_t i = 0; s.ok() && i < moves.size(); ++i) {
    s = ExecuteMove(moves[i], slots[i], released);
    if (!s.ok()) failed = i;
  }
  // Source slots are reported only once the copies reading them have landed: the daemon may
  // hand them to someone else as soon as it has the ack.
  if (fence_.held_slots() > 0) {
    absl::Status waited = backend_->Wait(fence_.SlotsToken());
    if (s.ok()) s = waited;
    PollFence();
    std::vector<ReleasedSlot> landed = fence_.TakeLandedSlots();
    if (released != nullptr) released->insert(released->end(), landed.begin(), landed.end());
  }
  if (!s.ok() && failed < moves.size()) {
    // Moves before the failed one are applied and the page table is consistent; it and the
    // rest are not. `released` lists the slots already freed by the applied moves.
    return absl::Status(s.code(), absl::StrCat("moves[", failed, "]: ", s.message(), "; moves [0, ",
                                               failed, ") applied, the rest not"));
  }
  RETURN_IF_ERROR(s);
  stats_.apply_nanos +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  ++stats_.plans_applied;
  return absl::OkStatus();
}

absl::Status TieredKvStore::ApplyPlanLocal(const std::vector<Move>& moves, SlotSource& source) {
  std::vector<SlotAssignment> slots(moves.size());
  std::vector<ReleasedSlot> granted;
  auto give_back = [&] {
    for (const ReleasedSlot& s : granted) source.Free(s.kind, s.offset).IgnoreError();
  };
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    if ((m.to != Tier::kT1 && m.to != Tier::kT2) || m.group >= geometry_.layer_groups) continue;
    const PoolKind kind = m.to == Tier::kT1 ? PoolKind::kDdr : PoolKind::kCompressed;
    auto offset = source.AllocateSlot(kind, SlotBytes(kind, m.group));
    if (!offset.ok()) {
      give_back();
      return offset.status();
    }
    slots[i].dst_offset = *offset;
    granted.push_back({kind, *offset});
  }
  std::vector<ReleasedSlot> released;
  if (absl::Status s = ApplyPlan(moves, slots, &released); !s.ok()) {
    give_back();
    return s;
  }
  for (const ReleasedSlot& r : released) RETURN_IF_ERROR(source.Free(r.kind, r.offset));
  return absl::OkStatus();
}

}  // namespace kvtier::worker
