#include "core/blocks/block_space.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::blocks {

BlockSpace::BlockSpace(uint64_t slots, BlockTableWriter* table) : slots_(slots), table_(table) {
  free_.reserve(slots);
  for (uint64_t s = slots; s > 0; --s) free_.push_back(s - 1);  // lowest slot first
  stats_.slots = slots;
}

bool BlockSpace::TakeSlot(uint64_t* slot) {
  if (free_.empty()) {
    // The least recently used block nobody reads goes.
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      Block& b = blocks_.at(*it);
      if (b.readers > 0) continue;
      const std::string key = *it;  // Free erases the list node `it` points at
      Free(key);
      ++stats_.evictions;
      break;
    }
  }
  if (free_.empty()) return false;
  *slot = free_.back();
  free_.pop_back();
  return true;
}

void BlockSpace::Unpublish(const std::string& key, Block& b) {
  (void)key;
  if (!b.published) return;
  if (table_ != nullptr && b.table_index != UINT64_MAX) table_->Clear(b.table_index, b.generation);
  lru_.erase(b.lru);
  b.published = false;
  --stats_.published;
}

void BlockSpace::Free(const std::string& key) {
  auto it = blocks_.find(key);
  Unpublish(key, it->second);
  free_.push_back(it->second.slot);
  blocks_.erase(it);
}

BlockTicket BlockSpace::BeginStore(OwnerId owner, absl::Span<const std::string> keys) {
  BlockTicket out;
  out.slots.reserve(keys.size());
  Ticket t{owner, /*store=*/true, {}};
  for (const std::string& key : keys) {
    if (blocks_.contains(key)) {
      out.slots.push_back(kPresent);
      continue;
    }
    uint64_t slot;
    if (!TakeSlot(&slot)) {
      ++stats_.stores_no_room;
      out.slots.push_back(kNoRoom);
      continue;
    }
    blocks_[key].slot = slot;
    ++stats_.pending;
    t.keys.push_back(key);
    out.slots.push_back(static_cast<int64_t>(slot));
  }
  if (!t.keys.empty()) {
    out.ticket = next_ticket_++;
    tickets_.emplace(out.ticket, std::move(t));
  }
  return out;
}

void BlockSpace::EndTicket(uint64_t id, Ticket& t, bool publish) {
  for (const std::string& key : t.keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end()) continue;
    Block& b = it->second;
    if (!t.store) {
      if (--b.readers == 0) --stats_.leased;
      continue;
    }
    --stats_.pending;
    if (!publish) {
      free_.push_back(b.slot);
      blocks_.erase(it);
      continue;
    }
    b.published = true;
    b.generation = next_generation_++;
    lru_.push_front(key);
    b.lru = lru_.begin();
    ++stats_.published;
    ++stats_.stored;
    if (table_ != nullptr) {
      uint64_t dropped = 0;
      b.table_index = table_->Publish(key, b.slot, b.generation, &dropped);
    }
  }
  if (!t.store) --stats_.leases;
  tickets_.erase(id);
}

absl::Status BlockSpace::FinishStore(OwnerId owner, uint64_t ticket, bool ok) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.owner != owner || !it->second.store) {
    return absl::NotFoundError(absl::StrCat("no store ticket ", ticket, " of this process"));
  }
  EndTicket(ticket, it->second, ok);
  return absl::OkStatus();
}

BlockTicket BlockSpace::Acquire(OwnerId owner, absl::Span<const std::string> keys) {
  BlockTicket out;
  out.slots.reserve(keys.size());
  Ticket t{owner, /*store=*/false, {}};
  for (const std::string& key : keys) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || !it->second.published) {
      out.slots.push_back(kMissing);
      ++stats_.misses;
      continue;
    }
    Block& b = it->second;
    if (b.readers++ == 0) ++stats_.leased;
    ++stats_.hits;
    lru_.splice(lru_.begin(), lru_, b.lru);
    t.keys.push_back(key);
    out.slots.push_back(static_cast<int64_t>(b.slot));
  }
  if (!t.keys.empty()) {
    out.ticket = next_ticket_++;
    tickets_.emplace(out.ticket, std::move(t));
    ++stats_.leases;
  }
  return out;
}

absl::Status BlockSpace::Release(OwnerId owner, uint64_t ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.owner != owner || it->second.store) {
    return absl::NotFoundError(absl::StrCat("no lease ticket ", ticket, " of this process"));
  }
  EndTicket(ticket, it->second, false);
  return absl::OkStatus();
}

void BlockSpace::DropOwner(OwnerId owner) {
  std::vector<uint64_t> ids;
  for (const auto& [id, t] : tickets_) {
    if (t.owner == owner) ids.push_back(id);
  }
  for (uint64_t id : ids) EndTicket(id, tickets_.at(id), /*publish=*/false);
  if (!ids.empty()) ++stats_.owners_dropped;
}

std::vector<OwnerId> BlockSpace::Owners() const {
  std::vector<OwnerId> out;
  for (const auto& [id, t] : tickets_) out.push_back(t.owner);
  return out;
}

BlockSpaceStats BlockSpace::stats() const { return stats_; }

}  // namespace kvtier::blocks
