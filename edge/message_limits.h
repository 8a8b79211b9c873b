#ifndef KVTIER_EDGE_MESSAGE_LIMITS_H_
#define KVTIER_EDGE_MESSAGE_LIMITS_H_

// Bounds on gRPC message sizes derived from the daemon's limits, so that both sides set their
// send and receive limits to values that fit the largest snapshot and plan the limits allow
// (checked by edge/message_limits_test.cc against serialized worst cases).

#include <cstdint>

namespace kvtier::edge {

// The hard cap on layer_groups x num_pages of one snapshot, whatever the config says.
inline constexpr uint64_t kMaxSnapshotEntriesCap = 1ull << 24;
// Memory-channel datagrams carry small messages only.
inline constexpr uint64_t kMaxChannelMessageBytes = 64 * 1024;

// Largest serialized SubmitSnapshotRequest with `entries` pages (every field at its widest).
uint64_t MaxSnapshotBytes(uint64_t entries);
// Largest serialized TierPlan for `entries` pages: one move per page at most.
uint64_t MaxPlanBytes(uint64_t entries);
// What a client must accept from the daemon whatever its config: a plan at the hard cap.
uint64_t MaxReplyBytes();

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_MESSAGE_LIMITS_H_
