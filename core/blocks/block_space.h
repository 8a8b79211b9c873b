#ifndef KVTIER_CORE_BLOCKS_BLOCK_SPACE_H_
#define KVTIER_CORE_BLOCKS_BLOCK_SPACE_H_

// One block store: content key -> slot of a fixed-size block arena, for the engines of one trust
// domain that share a model and a KV layout (docs/vllm.md). Pure bookkeeping: the daemon owns the
// arena's memory and the shared table; workers copy the bytes.
//
// A block is visible only once the store that wrote it finished (two phases: BeginStore grants
// slots, FinishStore publishes them), so a writer that dies mid-copy leaves nothing half-visible.
// A block leased by a reader (Acquire .. Release) is never evicted nor its slot reused. Published
// blocks nobody reads are evicted least recently used first when a store needs room. Everything a
// dead owner held (its pending stores, its leases) goes with DropOwner; nothing another owner
// reads goes with it.
//
// Not thread-safe: the daemon holds its lock around every call.

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/blocks/block_table.h"

namespace kvtier::blocks {

using OwnerId = uint64_t;

// Per key of a grant or lease: a slot, or why not.
inline constexpr int64_t kPresent = -1;  // store: already stored or being stored; skip it
inline constexpr int64_t kNoRoom = -2;   // store: every slot pending or leased
inline constexpr int64_t kMissing = -3;  // acquire: not stored (or not yet published)

struct BlockTicket {
  uint64_t ticket = 0;         // 0 when no slot was granted or leased
  std::vector<int64_t> slots;  // one per key, in order
};

struct BlockSpaceStats {
  uint64_t slots = 0;
  uint64_t published = 0;
  uint64_t pending = 0;
  uint64_t leased = 0;  // blocks with at least one reader
  uint64_t leases = 0;  // lease tickets not yet released
  // Cumulative: blocks published, keys an acquire found or did not, unread blocks evicted, keys
  // a store found no slot for, owners whose holdings were dropped.
  uint64_t stored = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t stores_no_room = 0;
  uint64_t owners_dropped = 0;
};

class BlockSpace {
 public:
  // `table` (may be null) hears of every publication and eviction; it must outlive this.
  BlockSpace(uint64_t slots, BlockTableWriter* table);

  // Grants a slot for every key not stored or being stored, evicting unread blocks as needed.
  BlockTicket BeginStore(OwnerId owner, absl::Span<const std::string> keys);
  // Publishes (ok) or frees the ticket's slots. NOT_FOUND when `owner` holds no such ticket.
  absl::Status FinishStore(OwnerId owner, uint64_t ticket, bool ok);
  // Leases the published blocks of `keys` (kMissing for the others) and marks them used.
  BlockTicket Acquire(OwnerId owner, absl::Span<const std::string> keys);
  // Ends a lease. NOT_FOUND when `owner` holds no such ticket.
  absl::Status Release(OwnerId owner, uint64_t ticket);
  // Forgets everything `owner` held: its pending slots are freed, its leases end.
  void DropOwner(OwnerId owner);
  // Owners that hold a pending store or a lease.
  std::vector<OwnerId> Owners() const;

  BlockSpaceStats stats() const;

 private:
  struct Block {
    uint64_t slot = 0;
    bool published = false;
    uint32_t readers = 0;
    uint64_t generation = 0;
    uint64_t table_index = UINT64_MAX;     // its hint in the shared table, if any
    std::list<std::string>::iterator lru;  // published only; front = most recently used
  };
  struct Ticket {
    OwnerId owner = 0;
    bool store = false;
    std::vector<std::string> keys;  // the keys granted or leased
  };

  bool TakeSlot(uint64_t* slot);
  void Unpublish(const std::string& key, Block& b);
  void Free(const std::string& key);
  void EndTicket(uint64_t id, Ticket& t, bool publish);

  const uint64_t slots_;
  BlockTableWriter* const table_;
  std::vector<uint64_t> free_;
  absl::flat_hash_map<std::string, Block> blocks_;
  std::list<std::string> lru_;
  absl::flat_hash_map<uint64_t, Ticket> tickets_;
  uint64_t next_ticket_ = 1;
  uint64_t next_generation_ = 1;
  BlockSpaceStats stats_;
};

}  // namespace kvtier::blocks

#endif  // KVTIER_CORE_BLOCKS_BLOCK_SPACE_H_
