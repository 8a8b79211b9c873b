#include "core/blocks/block_table.h"

#include <algorithm>
#include <cstring>

namespace kvtier::blocks {
namespace {

uint64_t Load(const uint64_t& v, std::memory_order order = std::memory_order_relaxed) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(v)).load(order);
}
uint32_t Load32(const uint32_t& v) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(v)).load(std::memory_order_relaxed);
}
void Store(uint64_t& v, uint64_t x, std::memory_order order = std::memory_order_relaxed) {
  std::atomic_ref<uint64_t>(v).store(x, order);
}

// The key as whole words, zero-padded (entries compare words, never bytes).
void KeyWords(std::string_view key, uint64_t (&words)[kMaxKeyBytes / 8]) {
  std::memset(words, 0, sizeof(words));
  std::memcpy(words, key.data(), std::min<size_t>(key.size(), kMaxKeyBytes));
}

}  // namespace

BlockTableHeader NewBlockTableHeader(uint64_t slots, uint32_t key_bytes, uint64_t block_bytes,
                                     uint64_t daemon_epoch, uint64_t space_id) {
  BlockTableHeader h{};
  h.magic = kBlockTableMagic;
  h.abi_version = kBlockTableAbiVersion;
  h.header_bytes = sizeof(BlockTableHeader);
  h.entry_bytes = sizeof(BlockTableEntry);
  h.buckets = BlockTableBuckets(slots);
  h.ways = kBlockTableWays;
  h.key_bytes = key_bytes;
  h.block_bytes = block_bytes;
  h.block_slots = slots;
  h.daemon_epoch = daemon_epoch;
  h.space_id = space_id;
  return h;
}

uint64_t BlockTableBuckets(uint64_t slots) {
  return std::max<uint64_t>(1, (2 * slots + kBlockTableWays - 1) / kBlockTableWays);
}

uint64_t BlockTableBytes(uint64_t buckets) {
  const uint64_t raw =
      sizeof(BlockTableHeader) + buckets * kBlockTableWays * sizeof(BlockTableEntry);
  return (raw + 4095) / 4096 * 4096;
}

BlockTableWriter::BlockTableWriter(uint8_t* base, const BlockTableHeader& header)
    : base_(base), buckets_(header.buckets) {
  std::memcpy(base_, &header, sizeof(header));
}

BlockTableEntry* BlockTableWriter::Entry(uint64_t index) const {
  return reinterpret_cast<BlockTableEntry*>(base_ + sizeof(BlockTableHeader)) + index;
}

uint64_t BlockTableWriter::Publish(std::string_view key, uint64_t slot, uint64_t generation,
                                   uint64_t* dropped) {
  const uint64_t first = (BlockKeyHash(key) % buckets_) * kBlockTableWays;
  uint64_t index = first + next_way_++ % kBlockTableWays;
  for (uint64_t w = 0; w < kBlockTableWays; ++w) {
    if (Load(Entry(first + w)->slot_plus_one) == 0) {
      index = first + w;
      break;
    }
  }
  BlockTableEntry* e = Entry(index);
  *dropped = Load(e->slot_plus_one);
  uint64_t words[kMaxKeyBytes / 8];
  KeyWords(key, words);
  const uint64_t seq = Load(e->seq);
  Store(e->seq, seq + 1);
  std::atomic_thread_fence(std::memory_order_release);
  Store(e->slot_plus_one, slot + 1);
  Store(e->generation, generation);
  std::atomic_ref<uint32_t>(e->key_bytes)
      .store(static_cast<uint32_t>(key.size()), std::memory_order_relaxed);
  for (size_t i = 0; i < kMaxKeyBytes / 8; ++i) Store(e->key[i], words[i]);
  Store(e->seq, seq + 2, std::memory_order_release);
  return index;
}

void BlockTableWriter::Clear(uint64_t index, uint64_t generation) {
  BlockTableEntry* e = Entry(index);
  if (Load(e->generation) != generation) return;
  const uint64_t seq = Load(e->seq);
  Store(e->seq, seq + 1);
  std::atomic_thread_fence(std::memory_order_release);
  Store(e->slot_plus_one, 0);
  Store(e->seq, seq + 2, std::memory_order_release);
}

BlockTableReader::BlockTableReader(const uint8_t* base, uint64_t mapped_bytes) {
  if (base == nullptr || mapped_bytes < sizeof(BlockTableHeader)) return;
  const auto* h = reinterpret_cast<const BlockTableHeader*>(base);
  if (h->magic != kBlockTableMagic || h->abi_version != kBlockTableAbiVersion ||
      h->header_bytes != sizeof(BlockTableHeader) || h->entry_bytes != sizeof(BlockTableEntry) ||
      h->ways != kBlockTableWays || h->buckets == 0 || h->key_bytes == 0 ||
      h->key_bytes > kMaxKeyBytes || BlockTableBytes(h->buckets) > mapped_bytes) {
    return;
  }
  header_ = h;
  entries_ = reinterpret_cast<const BlockTableEntry*>(base + sizeof(BlockTableHeader));
}

bool BlockTableReader::Find(std::string_view key, BlockTableHit* hit) const {
  if (header_ == nullptr || key.size() != header_->key_bytes) return false;
  uint64_t words[kMaxKeyBytes / 8];
  KeyWords(key, words);
  const uint64_t first = (BlockKeyHash(key) % header_->buckets) * kBlockTableWays;
  for (uint64_t w = 0; w < kBlockTableWays; ++w) {
    const BlockTableEntry& e = entries_[first + w];
    const uint64_t before = Load(e.seq, std::memory_order_acquire);
    if (before & 1) continue;
    const uint64_t slot_plus_one = Load(e.slot_plus_one);
    const uint64_t generation = Load(e.generation);
    bool same = Load32(e.key_bytes) == key.size();
    for (size_t i = 0; same && i < kMaxKeyBytes / 8; ++i) same = Load(e.key[i]) == words[i];
    std::atomic_thread_fence(std::memory_order_acquire);
    if (Load(e.seq) != before || !same || slot_plus_one == 0) continue;
    if (slot_plus_one > header_->block_slots) continue;  // never a slot outside the arena
    *hit = {slot_plus_one - 1, generation};
    return true;
  }
  return false;
}

}  // namespace kvtier::blocks
