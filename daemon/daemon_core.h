#ifndef KVTIER_DAEMON_DAEMON_CORE_H_
#define KVTIER_DAEMON_DAEMON_CORE_H_

// The daemon's request handling, independent of gRPC: the service (daemon/service) is a thin
// adapter that calls one method here per RPC. Tests and the fuzzer drive this class directly.

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/clock/clock.h"
#include "daemon/block_index.h"
#include "daemon/block_options.h"
#include "daemon/extent.h"
#include "edge/cuda_driver.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

class Metrics;

// Who may register and who may see every worker ([security] in deploy/kvtierd.toml).
struct SecurityOptions {
  // Both empty: root, the daemon's own uid and members of the pool group (pool_gid) may
  // register. Otherwise only these uids and members of these groups.
  std::vector<uint32_t> allow_uids;
  std::vector<uint32_t> allow_gids;
  // May list every worker and sequence (kvtierctl). The daemon's own uid always may; nobody else
  // by default (not even root: root worker pods are tenants like any other).
  std::vector<uint32_t> operator_uids;
  gid_t pool_gid = static_cast<gid_t>(-1);  // -1: the daemon's group
};

// One host link of the operator's table ([links] in deploy/kvtierd.toml).
struct LinkEntry {
  std::string id;
  double bytes_per_second = 0;  // host-to-device, in (0, 1e12]
  uint32_t numa_node = 0;
};

// Settings the core needs (the daemon's TOML config carries them; see deploy/kvtierd.toml).
struct CoreOptions {
  uint64_t ddr_pool_bytes = 1ull << 30;           // T1 budget, node-wide
  uint64_t compressed_pool_bytes = 512ull << 20;  // T2 budget, node-wide
  // Budgets are handed out in extents of this size (smaller for small budgets: at most a
  // sixteenth of the budget, at least 2 MiB, never more than the budget).
  uint64_t extent_bytes = 16ull << 20;
  // "" = memfd extents; otherwise a tmpfs directory for unnamed (O_TMPFILE) extents.
  std::string extent_dir;
  // pools.backend and pools.numa_node as configured (-1 = nearest the GPUs). kvtierd resolves
  // them at start (daemon/pool_backend.h) into pool_memory and cuda, which the core uses as
  // given: memfd unless a pool is kCudaVmm, which needs `cuda`.
  std::string pool_backend = "auto";
  int numa_node = -1;
  // pools.cuda_library: the driver library kvtierd loads for CUDA VMM pools (dlopen name or path).
  std::string cuda_library = "libcuda.so.1";
  std::array<ExtentMemory, 2> pool_memory = {ExtentMemory::kMemfd, ExtentMemory::kMemfd};
  std::shared_ptr<const edge::cuda::Driver> cuda;
  int pinned_numa_node = 0;            // where CUDA VMM pools are pinned
  std::string shm_prefix = "/kvtier";  // labels the extents (/proc/PID/maps shows memfd:LABEL)
  std::string shm_group;               // group owning the sockets ("" = process gid)
  uint32_t shm_mode = 0660;
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(2);
  uint32_t max_workers = 256;
  uint32_t max_sequences_per_worker = 1024;
  uint32_t max_sequences = 65536;              // node-wide
  uint64_t max_snapshot_entries = 1ull << 21;  // layer_groups x num_pages of one snapshot
  // Snapshot entries (layer_groups x num_pages) the sequences of one worker, and of the node,
  // may hold: each costs the daemon's heap a byte of tiers and a byte of the plan in flight, a
  // pooled page its slot. One worker at its limit holds an eighth of the node's.
  uint64_t max_worker_entries = 1ull << 24;
  uint64_t max_node_entries = 1ull << 27;
  uint64_t worker_ddr_quota_bytes = 0;  // 0 = no per-worker quota
  uint64_t worker_compressed_quota_bytes = 0;
  SecurityOptions security;
  BlockOptions blocks;          // [blocks]: the block store engines share (daemon/block_index.h)
  std::string listen_address;   // shown in status
  std::string metrics_address;  // shown in status
  uint64_t daemon_epoch = 0;    // 0 = random per start (tests may fix it)
  // [links]: host links as the operator describes them (link_id -> bandwidth, NUMA node). A
  // worker naming one of these link_ids shares it with every worker that does, at this
  // bandwidth, whatever it declares; any other link_id is scoped to the declaring uid.
  std::vector<LinkEntry> links;
  // Prefetch schedules: the step time assumed for a worker that has not reported one yet
  // (turns its link share into bytes per step).
  absl::Duration assumed_step = absl::Milliseconds(20);
};

// Owns the pools, the registry of workers and sequences, and the leases. Thread-safe: every
// method may be called concurrently from gRPC threads and the reaper.
//
// Semantics the service relies on (see also the proto's comments):
//  - a worker registers with a ticket from Hello (the memory channel, where the kernel names the
//    peer) and gets a session secret; a request naming a worker without its secret is
//    PERMISSION_DENIED and changes nothing (not even the lease);
//  - every request from a registered worker renews its lease; a lease found expired on a
//    request is reaped at once (FAILED_PRECONDITION "register again"), ids never issued by this
//    daemon are NOT_FOUND (Heartbeat answers FAILED_PRECONDITION for both);
//  - one plan in flight per sequence; a snapshot's last_plan_version must be the last plan
//    acknowledged (applied or refused) or the last applied; snapshots of one sequence are
//    serialized (a resubmission waits for the first and gets its plan), and no request waits for
//    another sequence's policy decision (it runs without the registry lock);
//  - slots: destinations are granted at SubmitSnapshot, sources freed only on AckPlan(applied);
//    a short pool or quota degrades the plan (compress instead when the policy compresses,
//    otherwise the page keeps its tier) and never raises eviction.
class DaemonCore {
 public:
  // Creates the pools (shared memory) and an empty registry. `clock` and `metrics` must outlive
  // the core; `metrics` may be null (no metrics).
  static absl::StatusOr<std::unique_ptr<DaemonCore>> Create(const CoreOptions& options,
                                                            Clock* clock, Metrics* metrics);
  virtual ~DaemonCore() = default;

  virtual absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) = 0;
  virtual absl::StatusOr<v1::OpenSequenceResponse> OpenSequence(
      const v1::OpenSequenceRequest& request) = 0;
  virtual absl::StatusOr<v1::TierPlan> SubmitSnapshot(const v1::SubmitSnapshotRequest& request) = 0;
  virtual absl::StatusOr<v1::AckPlanResponse> AckPlan(const v1::AckPlanRequest& request) = 0;
  virtual absl::StatusOr<v1::CloseSequenceResponse> CloseSequence(
      const v1::CloseSequenceRequest& request) = 0;
  virtual absl::StatusOr<v1::CloseWorkerResponse> CloseWorker(
      const v1::CloseWorkerRequest& request) = 0;
  virtual absl::StatusOr<v1::GetStatusResponse> GetStatus(const v1::GetStatusRequest& request) = 0;
  // Everything an operator's GetStatus shows, for the daemon's own status page (kvtierd serves it
  // beside /metrics; who may read it is whoever may reach that address). Not counted as a request.
  virtual v1::GetStatusResponse OperatorStatus() = 0;

  // The memory channel's requests. `peer` is what the kernel said about the caller.
  // Hello: a ticket when the peer may register (PERMISSION_DENIED naming the rule otherwise).
  virtual absl::StatusOr<v1::ChannelReply> Hello(const edge::PeerCredentials& peer) = 0;
  // FetchExtents: the caller's own header and extents, as descriptors it owns (duplicates of
  // the daemon's). The peer's uid must be the registered worker's.
  virtual absl::StatusOr<v1::ChannelReply> FetchExtents(const edge::PeerCredentials& peer,
                                                        const v1::FetchExtents& request,
                                                        std::vector<edge::UniqueFd>* fds) = 0;

  // A heartbeat over the memory channel (its kept connection, daemon/kvtierd/channel_lane.h):
  // the RPC's answer in `heartbeat`, when the peer's uid is the registered worker's. It renews
  // the lease but is no call on the gRPC socket (SinceLastCall does not count it).
  virtual absl::StatusOr<v1::ChannelReply> ChannelHeartbeat(
      const edge::PeerCredentials& peer, const v1::HeartbeatRequest& request) = 0;
  // A snapshot over the memory channel (its kept connection, daemon/kvtierd/channel_lane.h):
  // SubmitSnapshot's plan in `plan`, when the peer's uid is the registered worker's. Like a
  // channel heartbeat it is no call on the gRPC socket.
  virtual absl::StatusOr<v1::ChannelReply> ChannelSnapshot(
      const edge::PeerCredentials& peer, const v1::SubmitSnapshotRequest& request) = 0;

  // Expires leases older than the TTL (by the injected clock) and returns every slot of those
  // workers to the pools; their extents drain until the processes that received them exit
  // (checked here too: extents whose holders are gone go back to the budget). Returns the
  // number of workers reaped. Called periodically by kvtierd.
  virtual int ReapExpired() = 0;

  // How long since the last authenticated call on the gRPC socket of the live sessions whose
  // channel hello came from process `pid`; nullopt when it holds none. The unread guard asks it
  // before dropping a connection: a worker that has called nothing since its bytes went unread is
  // paused, not stuck.
  virtual std::optional<absl::Duration> SinceLastCall(pid_t pid) = 0;

  // Makes spare extents for each pool (up to two, within the budget, for budgets of 8 extents
  // or more) outside the core's lock, so
  // that grants seldom create one while holding it. Called periodically by kvtierd (the reaper's
  // thread); a core that never calls it creates every extent at grant time.
  virtual void PrepareSpareExtents() = 0;

  // Applies settings that can change without a restart: per-worker quotas, max_workers,
  // max_sequences_per_worker, max_sequences, max_worker_entries, max_node_entries, lease_ttl and
  // heartbeat_interval (when > 0), [security]. Others (pool sizes, extents, epoch) are ignored.
  // Lower caps do not evict anything already admitted. INVALID_ARGUMENT (and nothing applied) when
  // the lease TTL would not exceed the heartbeat interval. A registered worker whose peer the new
  // [security] no longer allows loses its session at once: its requests are PERMISSION_DENIED
  // naming the rule and its extents drain like a closed worker's; `revoked` (may be null) gets
  // one line each.
  absl::Status Reload(const CoreOptions& options) { return Reload(options, nullptr); }
  virtual absl::Status Reload(const CoreOptions& options, std::vector<std::string>* revoked) = 0;

  // The block store (memory channel block requests); its peers pass [security] as Hello's do.
  virtual BlockIndex* blocks() = 0;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_DAEMON_CORE_H_
