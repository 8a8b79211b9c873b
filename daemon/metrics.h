#ifndef KVTIER_DAEMON_METRICS_H_
#define KVTIER_DAEMON_METRICS_H_

// The daemon's Prometheus metrics, defined once here (no singletons: kvtierd creates one
// Metrics, registers registry() with its prometheus::Exposer and hands the pointer to the core).
// Names follow kvtier_<subsystem>_<what>_<unit>; counters end in _total; every label has a small
// fixed set of values.
//
// Pools (tier = "T1" | "T2"):
//   kvtier_pool_capacity_bytes{tier}        gauge   bytes of slot space in the pool
//   kvtier_pool_used_bytes{tier}            gauge   bytes of granted slots
//   kvtier_pool_reserved_bytes{tier}        gauge   bytes held by slot extents (used + slack);
//                                                   reserved - used is the fragmentation
//   kvtier_pool_used_slots{tier}            gauge   granted slots
//   kvtier_pool_draining_bytes{tier}        gauge   extents of ended sessions still held by a
//                                                   live process: charged (in reserved) until
//                                                   it exits
//   kvtier_pool_draining_holders            gauge   processes holding draining extents
//   kvtier_pool_allocation_failures_total{tier,reason}
//                                           counter slot requests refused; reason = "pool_full" |
//                                                   "quota"
// Placement (tier = "T0" | "T1" | "T2" | "T3"), committed placements of open sequences:
//   kvtier_placement_tokens{tier}           gauge   token positions per tier (layer-weighted)
//   kvtier_hbm_saved_bytes                  gauge   sum over sequences of full_bytes - t0_bytes
// Registry:
//   kvtier_registry_workers                 gauge   registered workers with a live lease
//   kvtier_registry_sequences               gauge   open sequences
//   kvtier_lease_expirations_total          counter workers reaped because their lease expired
// Requests (rpc = "RegisterWorker" | "Heartbeat" | "OpenSequence" | "SubmitSnapshot" |
//           "AckPlan" | "CloseSequence" | "GetStatus"; code = canonical code name, snake_case):
//   kvtier_rpc_requests_total{rpc}          counter requests handled by the core
//   kvtier_rpc_errors_total{rpc,code}       counter requests answered with an error
// Plans:
//   kvtier_snapshots_total                  counter snapshots accepted (a plan was produced)
//   kvtier_plan_latency_seconds             histogram SubmitSnapshot handling time (validation,
//                                                   policy, plan, slot allocation)
//   kvtier_plan_moves_total{kind}           counter planned moves; kind = "offload" | "compress" |
//                                                   "promote" | "decompress" | "evict"
//   kvtier_plan_moved_bytes_total{kind}     counter bytes planned per direction (same kinds; bytes
//                                                   of the destination copy, evict counts 0)
//   kvtier_plan_evicted_tokens_total        counter tokens newly evicted by committed plans
//   kvtier_plan_degraded_total{reason}      counter plans degraded; reason = "ddr_full" |
//                                                   "compressed_full" | "quota"
//   kvtier_plan_protected_overflow_total    counter plans whose protected pages exceed T0 budget
//   kvtier_plan_acks_total{result}          counter acknowledgements; result = "applied" |
//                                                   "refused" | "abandoned"
// Quality guardrail (docs/tiering.md), from the snapshots that carry it:
//   kvtier_sequence_lost_mass_ratio{part}   histogram attention mass per decode step a sequence
//                                                   could not serve exactly, one observation
//                                                   per accepted snapshot; part = "compressed"
//                                                   (T2 mass x codec error) | "evicted"
//                                                   (estimate) | "total"
// Connections (kvtierd's edges; what each dropped connection's peer did is also logged):
//   kvtier_connections_dropped_total{reason} counter reason = "grpc_unread" (a gRPC peer left
//                                                   answers unread: the unread guard) |
//                                                   "heartbeat_unread" | "heartbeat_too_fast" |
//                                                   "heartbeat_refused" (lease lost, stale epoch,
//                                                   another's session) | "heartbeat_misuse"
//                                                   (not a heartbeat) | "heartbeat_lane_full" |
//                                                   "snapshot_unread" | "snapshot_refused" |
//                                                   "snapshot_misuse" | "snapshot_lane_full"
//   kvtier_heartbeat_lane_connections       gauge   connections the heartbeat lane keeps
//   kvtier_heartbeat_lane_realtime          gauge   1 while the lane's thread runs at SCHED_FIFO
//   kvtier_snapshot_lane_connections        gauge   the same for the snapshot lane
//   kvtier_snapshot_lane_realtime           gauge
// The block store (kvtier_blocks_*): daemon/block_metrics.h.

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/tiering/types.h"
#include "daemon/block_metrics.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kvtier::daemon {

// Thread-safe: prometheus metric objects are atomic.
class Metrics {
 public:
  enum class Rpc : int {
    kRegisterWorker,
    kHeartbeat,
    kOpenSequence,
    kSubmitSnapshot,
    kAckPlan,
    kCloseSequence,
    kGetStatus,
    kCloseWorker,
    kChannelHello,  // the memory channel's requests
    kFetchExtents,
    kCount
  };
  enum class DegradeReason : int { kDdrFull, kCompressedFull, kQuota, kCount };
  enum class AllocFailure : int { kPoolFull, kQuota, kCount };
  enum class ConnectionDrop : int {
    kGrpcUnread,
    kHeartbeatUnread,
    kHeartbeatTooFast,
    kHeartbeatRefused,
    kHeartbeatMisuse,
    kHeartbeatLaneFull,
    kSnapshotUnread,
    kSnapshotRefused,
    kSnapshotMisuse,
    kSnapshotLaneFull,
    kChannelDescriptors,  // the memory channel: a request came with descriptors attached
    kChannelDeadline,     // no whole request within the deadline
    kChannelUidFull,      // past the per-uid budget of connections
    kChannelFull,         // past the channel's cap of connections
    kGrpcOverCap,         // refused: over a server.max_connections* cap
    kGrpcNoDescriptor,    // refused: the daemon was out of descriptors
    kCount
  };
  // The memory channel's lanes (daemon/kvtierd/channel_lane.h).
  enum class Lane : int { kHeartbeat, kSnapshot, kCount };

  static std::unique_ptr<Metrics> Create();
  ~Metrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  BlockMetrics& blocks() { return *blocks_; }

  // `tier` must be T1 or T2.
  // `reserved`: extents workers hold; `spare`: extents made ahead, held by none.
  void SetPool(tiering::Tier tier, uint64_t capacity, uint64_t used, uint64_t reserved,
               uint64_t slots, uint64_t spare = 0);
  // Draining pool memory (of ended sessions, still mapped by a live process): bytes per pool
  // (index 0 = T1, 1 = T2) and the processes that hold it.
  void SetDraining(const std::array<uint64_t, 2>& bytes, uint64_t holders);
  void CountAllocationFailure(tiering::Tier tier, AllocFailure reason);
  void SetPlacementTokens(const std::array<uint64_t, tiering::kNumTiers>& tokens);
  void SetHbmSavedBytes(uint64_t bytes);
  void SetRegistry(uint64_t workers, uint64_t sequences);
  void CountLeaseExpirations(uint64_t n);
  void CountRequest(Rpc rpc);
  void CountError(Rpc rpc, absl::StatusCode code);
  void CountSnapshot(double latency_seconds);
  // One snapshot's guardrail figures (SubmitSnapshotRequest.lost_mass).
  void ObserveLostMass(double compressed, double evicted);
  void CountMove(tiering::MoveKind kind, uint64_t bytes);
  void CountEvictedTokens(uint64_t tokens);
  void CountDegraded(DegradeReason reason);
  void CountProtectedOverflow();
  void CountAck(bool applied);
  // A plan the worker never received, refused by its next snapshot (abandon_pending).
  void CountAbandonedPlan();
  void CountDroppedConnection(ConnectionDrop reason);
  void SetLaneConnections(Lane lane, uint64_t kept);
  void SetLaneRealtime(Lane lane, bool realtime);
  // The memory channel's server (daemon/kvtierd/channel_server.h): connections waiting for an
  // answer, whether accept() is paused (out of descriptors), and its descriptor sink's backlog
  // and how long the close under way has blocked (0 = idle; a health figure).
  void SetChannelConnections(uint64_t waiting);
  void SetChannelAcceptPaused(bool paused);
  void SetDescriptorSink(uint64_t backlog, double stalled_seconds);

 private:
  Metrics();
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::unique_ptr<BlockMetrics> blocks_;
};

absl::string_view RpcName(Metrics::Rpc rpc);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_METRICS_H_
