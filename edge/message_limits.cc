#include "edge/message_limits.h"

namespace kvtier::edge {
namespace {

// Fixed fields (ids, versions, the report, the degraded reason, a secret) with room to spare.
constexpr uint64_t kFixedBytes = 8192;
// A packed repeated or bytes field's tag and length prefix.
constexpr uint64_t kFieldOverhead = 16;

}  // namespace

uint64_t MaxSnapshotBytes(uint64_t entries) {
  // page_scores: 4 bytes each (packed float); current_tiers: 1 byte each.
  return kFixedBytes + 2 * kFieldOverhead + entries * (4 + 1);
}

uint64_t MaxPlanBytes(uint64_t entries) {
  // target_tiers 1 byte; per move: group and page varints (5 each), from and to (1 each), two
  // slot varints (10 each). The schedule: each page once in one list (a varint, 5), and per
  // group (at most one a page) a message's tag and length with three packed lists' (6 each).
  return kFixedBytes + 7 * kFieldOverhead + entries * (1 + 5 + 5 + 1 + 1 + 10 + 10) +
         entries * (5 + 4 * 6);
}

uint64_t MaxReplyBytes() { return MaxPlanBytes(kMaxSnapshotEntriesCap); }

}  // namespace kvtier::edge
