#ifndef KVTIER_CLIENT_INCLUDE_KVTIER_CLIENT_H_
#define KVTIER_CLIENT_INCLUDE_KVTIER_CLIENT_H_

// libkvtier_client: a worker's connection to kvtierd. Public API.
//
//   ASSIGN_OR_RETURN(auto client, kvtier::WorkerClient::Connect(options));
//   ASSIGN_OR_RETURN(uint64_t seq, client->OpenSequence(prompt_len, policy, "req-42"));
//   ... every retier_interval steps:
//   ASSIGN_OR_RETURN(kvtier::v1::TierPlan plan, client->SubmitSnapshot(snapshot));
//   ... execute plan.moves against the mapped pools ...
//   RETURN_IF_ERROR(client->AckPlan(seq, plan.plan_version(), /*applied=*/true));
//   RETURN_IF_ERROR(client->CloseSequence(seq));
//
// A worker whose next snapshot follows soon may skip AckPlan and set the next snapshot's
// applied_plan_version (and last_plan_version) to the plan it applied: one round trip a plan.
//
// Sessions (docs/security.md): Connect asks the daemon's memory channel (the socket's path +
// ".mem") for a ticket, registers with it and keeps the session secret the daemon returns; every
// call carries it. A call lost to its deadline, or a daemon gone for a moment, keeps the session:
// the client resumes it (same worker id, memory and sequences) while the lease lives, and
// registers anew only when the daemon says the lease is gone or the daemon restarted.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {

struct ClientOptions {
  // "unix:/run/kvtier/kvtierd.sock": workers need the unix socket (the memory channel beside
  // it carries their credentials and memory); TCP serves GetStatus only.
  std::string address = "unix:/run/kvtier/kvtierd.sock";
  // No call blocks the caller longer than this (the decode loop must keep going).
  absl::Duration rpc_deadline = absl::Milliseconds(200);
  // What to register: geometry, GPU, budgets and slot sizes (worker_id/pid are filled in).
  v1::RegisterWorkerRequest registration;
  // Renew the lease in a background thread, and re-register when the daemon restarts.
  bool background_heartbeat = true;
  // Heartbeats go over a connection of the memory channel that the client keeps, answered by a
  // daemon thread of their own so that they never queue behind snapshots (docs/reliability.md);
  // false, or a daemon that does not take them there: over gRPC like every other call.
  bool heartbeat_over_channel = true;
  // Snapshots go over another kept connection of the memory channel, answered by a daemon thread
  // of their own at about half gRPC's CPU per snapshot (docs/reliability.md); a snapshot or plan
  // too large for one channel datagram (64 KiB), false, or a daemon that does not take them there:
  // over gRPC.
  bool snapshots_over_channel = true;
  // SCHED_FIFO priority (1-99) of the background heartbeat thread; 0 = the default policy. A
  // worker whose own threads keep every core busy delays its heartbeats by whole scheduler
  // slices; at a real-time priority the thread runs as soon as it wakes (beside a 32-worker flood
  // its p99 went from about 1 ms to 0.24–0.32 ms, docs/reliability.md). Needs RLIMIT_RTPRIO
  // (systemd LimitRTPRIO=, `ulimit -r`) or CAP_SYS_NICE; where refused the thread runs at the
  // default policy and heartbeat_realtime() says so.
  int heartbeat_priority = 0;
  // The CUDA driver loaded (at run time) when the daemon offers CUDA VMM pools. A worker that
  // cannot load it or import the daemon's memory registers again asking for memfd pools
  // (registration.pool_memory = POOL_MEMORY_CUDA_VMM makes that an error instead).
  std::string cuda_library = "libcuda.so.1";
  // The uid kvtierd runs as (docs/security.md, "Who answers"). The client talks only to a daemon
  // of that uid (or root): every memory-channel connection's peer (SO_PEERCRED), and the gRPC
  // socket file's owner and its directory (writable by nobody else) are checked, and every
  // extent descriptor's type, size and seals before it is mapped. -1: $KVTIER_DAEMON_UID (a uid
  // or a user name), else root, this process's uid and the `kvtier` system user's.
  int64_t daemon_uid = -1;
};

// Asks the memory channel beside the unix socket at `address` for a ticket (what
// RegisterWorker and an operator's GetStatus need). PERMISSION_DENIED names the rule when the
// caller's uid may not register; UNAUTHENTICATED names the uid found when the channel is not
// answered by the daemon's (`daemon_uid` as in ClientOptions).
absl::StatusOr<v1::ChannelReply> ChannelHello(const std::string& address, int64_t daemon_uid = -1);

// This worker's memory of one pool: a reserved address range into which the daemon's extents
// are mapped back to back as plans need them (docs/shm-abi.md). The mapping stays valid for as
// long as any holder keeps this object, even after the session ends (pages of a lost session
// stay readable until their sequences close; the daemon never hands that memory to anyone
// else). Thread-safe.
class PoolMapping {
 public:
  virtual ~PoolMapping() = default;
  virtual v1::PoolKind kind() const = 0;
  // First byte of the range; slot offsets are relative to it.
  virtual uint8_t* data() const = 0;
  // The whole range (max_extents * extent_bytes); only mapped_extents() of it are mapped.
  virtual uint64_t data_bytes() const = 0;
  virtual uint64_t epoch() const = 0;
  virtual uint32_t mapped_extents() const = 0;
  // Bytes of one extent: extent i is mapped at data() + i * extent_bytes().
  virtual uint64_t extent_bytes() const { return data_bytes(); }
  // True when the daemon's memory is CUDA VMM pinned host memory, mapped at data() for every
  // device and the host alike (docs/cuda.md, "Pool backends"): a CUDA worker copies to and from
  // it as is and must not cudaHostRegister it. False for memfd pools, which a CUDA worker pins
  // itself (worker/cuda/pinned_mapping.h).
  virtual bool device_mapped() const { return false; }
};

// A registered worker. Thread-safe; the heartbeat thread is owned by the client and stops in
// its destructor.
class WorkerClient {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerClient>> Connect(const ClientOptions& options);
  virtual ~WorkerClient() = default;

  virtual uint64_t worker_id() const = 0;
  // Bumps on every (re-)registration: sequences opened under an older generation are gone
  // from the daemon and must be re-opened.
  virtual uint64_t generation() const = 0;
  // False while the daemon is unreachable or the lease is lost; the worker keeps decoding on
  // its own (DESIGN.md §3) and the heartbeat thread re-registers when the daemon is back.
  virtual bool connected() const = 0;
  // The pools of the current registration (null before the first success).
  virtual std::shared_ptr<PoolMapping> pool(v1::PoolKind kind) const = 0;

  // `length`: positions the sequence already holds (one re-opened after a lost session), 0 for a
  // new one; the daemon shows it until a heartbeat or snapshot says more.
  // `protected_prompt_begin`: with the policy's protect_prompt, the first protected prompt
  // position (0 = the whole prompt; the start of the last user turn protects that turn only).
  virtual absl::StatusOr<uint64_t> OpenSequence(uint64_t prompt_tokens,
                                                const v1::PolicyConfig& policy,
                                                const std::string& tag, uint64_t length = 0,
                                                uint64_t protected_prompt_begin = 0) = 0;
  // Fills worker_id; the rest of the snapshot is the caller's.
  virtual absl::StatusOr<v1::TierPlan> SubmitSnapshot(v1::SubmitSnapshotRequest snapshot) = 0;
  virtual absl::Status AckPlan(uint64_t sequence_id, uint64_t plan_version, bool applied,
                               const std::string& error = "") = 0;
  virtual absl::Status CloseSequence(uint64_t sequence_id) = 0;
  virtual absl::StatusOr<v1::GetStatusResponse> GetStatus(bool workers, bool sequences) = 0;
  // One heartbeat now (the background thread calls this); re-registers when the lease is gone.
  virtual absl::Status HeartbeatOnce() = 0;
  // The lease TTL the daemon last announced (register and every heartbeat).
  virtual absl::Duration lease_ttl() const = 0;
  // The decode step time this worker measures (a recent mean), sent with every heartbeat: the
  // daemon turns the worker's share of its host link into bytes per step with it (prefetch
  // schedules). Non-finite or negative values count as 0 (unknown); at most 600 s.
  virtual void ReportStepSeconds(double seconds) = 0;
  // A sequence's length now (positions written), sent with every heartbeat so that the daemon's
  // status shows its size between re-tierings. Cheap (call it every step); CloseSequence forgets
  // it, and so does a new session (its sequences are re-opened with their lengths).
  virtual void ReportSequenceLength(uint64_t sequence_id, uint64_t length) = 0;
  // Why this worker's pools are memfd although the daemon offered CUDA VMM memory (the driver's
  // error, naming the pool); "" when they are not.
  virtual std::string pool_fallback_reason() const = 0;
  // True while the background heartbeat thread runs at options.heartbeat_priority.
  virtual bool heartbeat_realtime() const { return false; }
};

}  // namespace kvtier

#endif  // KVTIER_CLIENT_INCLUDE_KVTIER_CLIENT_H_
