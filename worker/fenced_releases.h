#ifndef KVTIER_WORKER_FENCED_RELEASES_H_
#define KVTIER_WORKER_FENCED_RELEASES_H_

// What a tier move gives up but an asynchronous copy may still read: the T0 block a demotion
// copies out of, and the pool slot a promotion copies from. A block returns to the arena, and a
// slot is reported for the daemon's ack, only once the copy that reads it completed. Pure host
// logic: the CUDA backend's tokens stand for CUDA events, the host backend's are always
// complete, and tests feed a fake token source.

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "core/layout/shm_abi.h"

namespace kvtier::worker {

using layout::PoolKind;

// Identifies the copies issued up to some point; kNoCopyPending = nothing to wait for.
using CopyToken = uint64_t;
inline constexpr CopyToken kNoCopyPending = 0;

// A pool slot the store no longer uses. The daemon frees it after the plan is acknowledged
// (two-phase); in local mode the caller gives it back to its SlotSource.
struct ReleasedSlot {
  PoolKind kind;
  uint64_t offset;
  friend bool operator==(const ReleasedSlot&, const ReleasedSlot&) = default;
};

// Not thread-safe: one store owns it.
class FencedReleases {
 public:
  using IsComplete = absl::FunctionRef<bool(CopyToken)>;
  using FreeBlock = absl::FunctionRef<void(uint8_t*, uint64_t)>;

  // The block goes back (free_block) now when `token` is kNoCopyPending, else at the first
  // Poll that finds the token complete.
  void HoldBlock(CopyToken token, uint8_t* block, uint64_t bytes, FreeBlock free_block);
  // The slot is reported by TakeLandedSlots once `token` completed.
  void HoldSlot(CopyToken token, ReleasedSlot slot);
  // Frees every held block whose copy completed and marks landed slots.
  void Poll(IsComplete complete, FreeBlock free_block);
  // Slots whose copies landed (in the order they were held), removed from the fence.
  std::vector<ReleasedSlot> TakeLandedSlots();

  // The latest token a held slot (block) waits for; kNoCopyPending when none waits.
  CopyToken SlotsToken() const;
  CopyToken BlocksToken() const;
  uint64_t held_block_bytes() const { return held_block_bytes_; }
  size_t held_blocks() const { return blocks_.size(); }
  size_t held_slots() const { return slots_.size(); }

 private:
  struct Block {
    CopyToken token;
    uint8_t* block;
    uint64_t bytes;
  };
  struct Slot {
    CopyToken token;
    ReleasedSlot slot;
    bool landed;
  };
  std::vector<Block> blocks_;
  std::vector<Slot> slots_;
  uint64_t held_block_bytes_ = 0;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_FENCED_RELEASES_H_
