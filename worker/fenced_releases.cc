#include "worker/fenced_releases.h"

#include <algorithm>

namespace kvtier::worker {

void FencedReleases::HoldBlock(CopyToken token, uint8_t* block, uint64_t bytes,
                               FreeBlock free_block) {
  if (token == kNoCopyPending) {
    free_block(block, bytes);
    return;
  }
  blocks_.push_back({token, block, bytes});
  held_block_bytes_ += bytes;
}

void FencedReleases::HoldSlot(CopyToken token, ReleasedSlot slot) {
  slots_.push_back({token, slot, token == kNoCopyPending});
}

void FencedReleases::Poll(IsComplete complete, FreeBlock free_block) {
  size_t kept = 0;
  for (const Block& b : blocks_) {
    if (complete(b.token)) {
      free_block(b.block, b.bytes);
      held_block_bytes_ -= b.bytes;
    } else {
      blocks_[kept++] = b;
    }
  }
  blocks_.resize(kept);
  for (Slot& s : slots_) s.landed = s.landed || complete(s.token);
}

std::vector<ReleasedSlot> FencedReleases::TakeLandedSlots() {
  std::vector<ReleasedSlot> out;
  size_t kept = 0;
  for (const Slot& s : slots_) {
    if (s.landed) {
      out.push_back(s.slot);
    } else {
      slots_[kept++] = s;
    }
  }
  slots_.resize(kept);
  return out;
}

CopyToken FencedReleases::SlotsToken() const {
  CopyToken t = kNoCopyPending;
  for (const Slot& s : slots_) {
    if (!s.landed) t = std::max(t, s.token);
  }
  return t;
}

CopyToken FencedReleases::BlocksToken() const {
  CopyToken t = kNoCopyPending;
  for (const Block& b : blocks_) t = std::max(t, b.token);
  return t;
}

}  // namespace kvtier::worker
