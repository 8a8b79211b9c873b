#ifndef KVTIER_CORE_BLOCKS_BLOCK_TABLE_H_
#define KVTIER_CORE_BLOCKS_BLOCK_TABLE_H_

// The shared block table (docs/vllm.md, docs/shm-abi.md): where a worker looks up, without a
// call to kvtierd, whether the block of a content key is in its domain's block store. The daemon
// writes it; workers map it read-only (the memfd is sealed against new writable mappings). It is
// a hint: a worker that sees a key here still asks the daemon for a lease before it reads the
// block, and the daemon checks the key again, so a stale or torn entry costs a miss, never a
// wrong block.
//
// Layout: a 128-byte header, then `buckets * ways` entries of 96 bytes. A key lives in bucket
// `BlockKeyHash(key) % buckets`, in any of its ways; a full bucket drops the oldest hint (the
// block stays stored, its lookups miss). Each entry is guarded by a sequence lock: odd while the
// daemon writes it. Readers copy the entry between two reads of `seq` and ignore it when they
// differ. Every field is read and written through atomic_ref, so readers never race the writer
// in the C++ sense.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvtier::blocks {

inline constexpr uint32_t kBlockTableMagic = 0x4254564B;  // "KVTB" in memory
inline constexpr uint32_t kBlockTableAbiVersion = 1;
inline constexpr uint32_t kMaxKeyBytes = 64;
inline constexpr uint32_t kBlockTableWays = 4;

struct BlockTableHeader {
  uint32_t magic;
  uint32_t abi_version;
  uint32_t header_bytes;
  uint32_t entry_bytes;
  uint64_t buckets;
  uint32_t ways;
  uint32_t key_bytes;  // every key of this space has exactly this size
  uint64_t block_bytes;
  uint64_t block_slots;
  uint64_t daemon_epoch;
  uint64_t space_id;
  uint8_t reserved[64];
};
static_assert(sizeof(BlockTableHeader) == 128);
static_assert(offsetof(BlockTableHeader, buckets) == 16);
static_assert(offsetof(BlockTableHeader, block_bytes) == 32);
static_assert(offsetof(BlockTableHeader, space_id) == 56);

struct BlockTableEntry {
  uint64_t seq;            // odd while written
  uint64_t slot_plus_one;  // 0 = empty
  uint64_t generation;     // the publication this entry names (never reused)
  uint32_t key_bytes;
  uint32_t reserved;
  uint64_t key[kMaxKeyBytes / 8];
};
static_assert(sizeof(BlockTableEntry) == 96);
static_assert(offsetof(BlockTableEntry, key) == 32);

// FNV-1a, 64 bit: daemon and workers must agree, and keys are digests already.
inline uint64_t BlockKeyHash(std::string_view key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The header of a table for `slots` blocks of `block_bytes`, keys of `key_bytes`.
BlockTableHeader NewBlockTableHeader(uint64_t slots, uint32_t key_bytes, uint64_t block_bytes,
                                     uint64_t daemon_epoch = 0, uint64_t space_id = 0);

// Buckets for `slots` blocks: about two entries per block, so that few hints are dropped.
uint64_t BlockTableBuckets(uint64_t slots);
// Bytes of a table of `buckets` buckets (header included), rounded up to 4 KiB.
uint64_t BlockTableBytes(uint64_t buckets);

// Writes a table laid out in `base` (zeroed, BlockTableBytes(header.buckets) long). One writer.
class BlockTableWriter {
 public:
  BlockTableWriter() = default;
  // Writes `header` at `base`. `base` must outlive the writer.
  BlockTableWriter(uint8_t* base, const BlockTableHeader& header);
  // Publishes key -> slot; returns the entry index it took (dropping the bucket's oldest hint
  // when all ways are taken: `*dropped` gets that entry's slot + 1, else 0).
  uint64_t Publish(std::string_view key, uint64_t slot, uint64_t generation, uint64_t* dropped);
  // Clears entry `index` if it still names `generation`.
  void Clear(uint64_t index, uint64_t generation);
  bool attached() const { return base_ != nullptr; }

 private:
  BlockTableEntry* Entry(uint64_t index) const;
  uint8_t* base_ = nullptr;
  uint64_t buckets_ = 0;
  uint64_t next_way_ = 0;  // round-robin victim within a full bucket
};

// What a reader found for a key.
struct BlockTableHit {
  uint64_t slot;
  uint64_t generation;
};

// Reads a table mapped read-only. Thread-safe (it only reads).
class BlockTableReader {
 public:
  BlockTableReader() = default;
  BlockTableReader(const uint8_t* base, uint64_t mapped_bytes);
  // Whether the mapping holds a table this reader understands (magic, version, sizes).
  bool valid() const { return header_ != nullptr; }
  const BlockTableHeader* header() const { return header_; }
  // The slot of `key`, when an entry names it and was not being written while read.
  bool Find(std::string_view key, BlockTableHit* hit) const;

 private:
  const BlockTableHeader* header_ = nullptr;
  const BlockTableEntry* entries_ = nullptr;
};

}  // namespace kvtier::blocks

#endif  // KVTIER_CORE_BLOCKS_BLOCK_TABLE_H_
