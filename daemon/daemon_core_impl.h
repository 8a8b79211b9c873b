#ifndef KVTIER_DAEMON_DAEMON_CORE_IMPL_H_
#define KVTIER_DAEMON_DAEMON_CORE_IMPL_H_

// Private to daemon/: the implementation of DaemonCore. Split over daemon_core.cc (registry,
// leases, status) and daemon_snapshot.cc (snapshots, plans, acknowledgements).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/layout/geometry.h"
#include "core/tiering/types.h"
#include "daemon/daemon_core.h"
#include "daemon/link_schedule.h"
#include "daemon/metrics.h"
#include "daemon/pi_mutex.h"
#include "daemon/placement_figures.h"
#include "daemon/plan_counts.h"
#include "daemon/slot_allocator.h"
#include "daemon/tiering_adapter.h"
#include "daemon/worker_memory.h"
#include "edge/peer_process.h"

namespace kvtier::daemon::internal {

// The extent size a budget of `capacity` bytes is handed out in: `configured`, but at most a
// sixteenth of the budget (at least 2 MiB) and never more than the budget; a multiple of 4 KiB.
uint64_t EffectiveExtentBytes(uint64_t configured, uint64_t capacity);

inline v1::PoolKind WireKind(layout::PoolKind kind) {
  return kind == layout::PoolKind::kDdr ? v1::POOL_KIND_DDR : v1::POOL_KIND_COMPRESSED;
}

// Index 0 = T1 (DDR), 1 = T2 (compressed).
inline int PoolIndex(tiering::Tier t) { return t == tiering::Tier::kT2 ? 1 : 0; }
inline bool InPool(tiering::Tier t) { return t == tiering::Tier::kT1 || t == tiering::Tier::kT2; }

struct WorkerRec {
  uint64_t id = 0;
  std::string secret;          // the session secret; compared in constant time, never shown
  edge::PeerCredentials peer;  // from the kernel, at the channel hello before registration
  // Every process that received this worker's extent descriptors (FetchExtents): where the
  // kernel cannot say whether an extent is still held, it is released only once those have
  // exited (DrainingMemory).
  std::vector<std::shared_ptr<const edge::PeerProcess>> holders;
  std::string name;
  int32_t pid = 0;
  std::string model_name;
  layout::KvGeometry geometry;
  uint64_t hbm_budget_bytes = 0;
  std::array<uint64_t, 2> page_bytes{};  // slot request per pool: t1_page_bytes, t2_page_bytes
  // The lease (last_seen, last_call, step_seconds) is the core's leases_[id], under lease_mu_.
  absl::flat_hash_set<uint64_t> sequences;
  uint64_t entries = 0;  // sum of its sequences' SequenceRec::entries() (limits.max_worker_entries)
  std::array<uint64_t, 2> pool_bytes{};  // slot bytes held, pending destinations included
  // The worker's memory of each pool (index PoolIndex). The registry frees the sequences'
  // slots before a worker record goes away.
  std::array<std::unique_ptr<WorkerMemory>, 2> memory;
  // Prefetch schedules: the declared link, the sum of its sequences' SequenceRec::scheduled_bytes,
  // and the last grant on its link (the last reported step time is its lease's).
  LinkDecl link;
  uint64_t scheduled_bytes = 0;
  double h2d_grant = 0;
  absl::Duration registered;  // by the injected clock
  PlanCounts plans;           // its sequences' plans, closed ones included
};

// What a heartbeat reads and renews, kept apart from the registry so that renewing it never
// waits for the core's mu_ (which a snapshot holds for work proportional to its size). A worker
// has a Lease while its WorkerRec is live; a lease found expired is removed at once (nothing
// renews it again) and the record is freed by the next holder of mu_ that looks (a request or
// the reaper).
struct Lease {
  std::string secret;  // the worker's session secret (a copy of WorkerRec::secret)
  uid_t uid = 0;       // the kernel's word at registration (a channel heartbeat must match it)
  absl::Duration last_seen;  // any authenticated request renews it
  absl::Duration last_call;  // the last request on the gRPC socket (the unread guard's question)
  double step_seconds = 0;   // the last reported step time (0 = none)
  // Sequence lengths the last heartbeat that carried any reported, by sequence id (at most
  // max_sequences_per_worker): status grows the acknowledged figures by them.
  absl::flat_hash_map<uint64_t, uint64_t> lengths;
};

// A request over the memory channel speaks for a worker only from the uid that registered it
// (the kernel's word, not the message's); `peer` null: the request came over gRPC.
absl::Status CheckSameUid(const WorkerRec& w, const edge::PeerCredentials* peer);

// A channel hello's answer, redeemable at RegisterWorker (once) or GetStatus (operators).
struct Ticket {
  edge::PeerCredentials peer;  // without its process (a ticket holds no pidfd)
  uint64_t process_id = 0;     // edge::PeerProcess::id of the hello's process; 0 = unknown
  absl::Duration expires;
  bool operator_view = false;
};

// Destination (or held) slots of a sequence's pages, by placement index: only pooled pages.
using SlotMap = absl::flat_hash_map<uint32_t, Slot>;

// The extents of an ended session (closed, lease lost, revoked) that some process may still
// hold: they stay charged to the budget, are never handed to anyone again (not even the same
// process: the client keeps an old session's pages mapped and readable after it registers
// again), and go back to the budget one by one as the kernel says nobody holds them
// (Extent::OthersHold), or, where it cannot say, once every process that received them exited.
struct DrainingMemory {
  uint64_t worker_id = 0;
  uid_t uid = 0;
  std::vector<std::shared_ptr<const edge::PeerProcess>> holders;
  std::array<std::vector<Extent>, 2> extents;  // per pool, charged to pools_[i]
};

struct PendingMove {
  tiering::Move move;
  Slot dst;  // valid iff move.to is T1 or T2
};

struct PendingPlan {
  uint64_t version = 0;
  std::vector<PendingMove> moves;
  PlacementFigures figures;  // of the target
  // What was sent, and a fingerprint of the snapshot it answered: the same snapshot again (its
  // reply was lost) gets the same plan, not a refusal. Shared and immutable, so that a replay
  // copies it without the core's lock.
  std::shared_ptr<const v1::TierPlan> sent;
  uint64_t snapshot_fingerprint = 0;
};

// Pages a plan could not place as the policy wanted, by Metrics::DegradeReason.
struct Shortage {
  std::array<uint64_t, 3> pages{};
  uint64_t compressed_instead = 0;
  uint64_t total() const { return pages[0] + pages[1] + pages[2]; }
};

struct SequenceRec {
  uint64_t id = 0;
  uint64_t worker_id = 0;
  std::string tag;
  PolicySpec policy;
  uint64_t prompt_tokens = 0;
  uint64_t protected_prompt_begin = 0;  // OpenSequenceRequest.protected_prompt_begin
  uint64_t length = 0;                  // of the last snapshot
  uint64_t open_length = 0;             // OpenSequenceRequest.length
  PlanCounts plans;
  tiering::Placement placement;  // acknowledged placement
  // The slot of every page placement puts in T1/T2, by placement index (group-major); pages in
  // T0 and T3 have none. Sparse: a sequence of 2M T0 pages costs 2 MB of tiers, not 48 MB.
  SlotMap slots;
  uint64_t last_acked = 0;    // last plan acknowledged (applied or refused)
  uint64_t last_applied = 0;  // last plan applied
  uint64_t next_version = 1;
  std::optional<PendingPlan> pending;
  bool closed = false;           // freed by the registry; a snapshot in progress gives up
  PlacementFigures figures;      // of the acknowledged placement
  uint64_t scheduled_bytes = 0;  // T1/T2 bytes of the last plan's target (schedules)
  // The guardrail its snapshots reported, for status (reports == 0: none yet).
  v1::SequenceLostMass lost_mass;
  // Serializes this sequence's snapshots, and is held across the policy decision, which runs
  // without the core's mu_. Only SubmitSnapshot takes it. Lock order: plan_mu, then mu_ (under
  // mu_ it is only ever tried, never waited for). Every field above is guarded by the core's mu_.
  absl::Mutex plan_mu;

  // Snapshot entries (layer groups x pages) the record holds: what limits.max_worker_entries and
  // limits.max_node_entries count.
  uint64_t entries() const { return placement.tiers.size(); }
};

// Holds a SequenceRec::plan_mu taken by TryLock or Lock; releases it on destruction.
class PlanLock {
 public:
  PlanLock() = default;
  PlanLock(const PlanLock&) = delete;
  PlanLock& operator=(const PlanLock&) = delete;
  ~PlanLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mu_ != nullptr) mu_->Unlock();
  }
  bool TryLock(absl::Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mu->TryLock()) mu_ = mu;
    return held();
  }
  void Lock(absl::Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu->Lock();
    mu_ = mu;
  }
  bool held() const { return mu_ != nullptr; }

 private:
  absl::Mutex* mu_ = nullptr;
};

// Test seams of the core (CoreOptions carries none: these are for tests only).
struct CoreHooks {
  // Called with no lock held while a snapshot's policy decision runs (after the snapshot was
  // validated, before its slots are granted), with the sequence id.
  std::function<void(uint64_t sequence_id)> during_decision;
  // Called with mu_ held while a snapshot is prepared (validated, before its record grows), with
  // the sequence id: what must not wait for a snapshot's work under mu_ (heartbeats) is tested
  // against it.
  std::function<void(uint64_t sequence_id)> holding_core_lock;
};

// Thread-safe. One mutex (mu_) guards the registry, the pools and every record; each sequence's
// plan_mu serializes its snapshots, whose policy decision is computed with mu_ released, so that
// acks, status and other sequences' snapshots never wait for a decision. Leases have a lock of
// their own (lease_mu_, held for a map lookup and a few stores): a heartbeat takes only it, so
// it never waits for a snapshot's validation, growth or grants under mu_. Lock order:
// SequenceRec::plan_mu, then mu_, then lease_mu_ (pools have no locks). The reaper decides
// expiry and removes the lease under lease_mu_ in one go, so a heartbeat either renews a lease
// before that (and the reaper sees it renewed) or finds it gone ("register again").
class DaemonCoreImpl final : public DaemonCore {
 public:
  DaemonCoreImpl(const CoreOptions& options, Clock* clock, Metrics* metrics, uint64_t epoch,
                 CoreHooks hooks = {});
  ~DaemonCoreImpl() override;

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override;
  absl::StatusOr<v1::OpenSequenceResponse> OpenSequence(
      const v1::OpenSequenceRequest& request) override;
  absl::StatusOr<v1::TierPlan> SubmitSnapshot(const v1::SubmitSnapshotRequest& request) override;
  absl::StatusOr<v1::AckPlanResponse> AckPlan(const v1::AckPlanRequest& request) override;
  absl::StatusOr<v1::CloseSequenceResponse> CloseSequence(
      const v1::CloseSequenceRequest& request) override;
  absl::StatusOr<v1::CloseWorkerResponse> CloseWorker(
      const v1::CloseWorkerRequest& request) override;
  absl::StatusOr<v1::GetStatusResponse> GetStatus(const v1::GetStatusRequest& request) override;
  v1::GetStatusResponse OperatorStatus() override;
  absl::StatusOr<v1::ChannelReply> Hello(const edge::PeerCredentials& peer) override;
  absl::StatusOr<v1::ChannelReply> FetchExtents(const edge::PeerCredentials& peer,
                                                const v1::FetchExtents& request,
                                                std::vector<edge::UniqueFd>* fds) override;
  absl::StatusOr<v1::ChannelReply> ChannelHeartbeat(const edge::PeerCredentials& peer,
                                                    const v1::HeartbeatRequest& request) override;
  absl::StatusOr<v1::ChannelReply> ChannelSnapshot(
      const edge::PeerCredentials& peer, const v1::SubmitSnapshotRequest& request) override;
  int ReapExpired() override;
  std::optional<absl::Duration> SinceLastCall(pid_t pid) override;
  void PrepareSpareExtents() override;
  using DaemonCore::Reload;
  absl::Status Reload(const CoreOptions& options, std::vector<std::string>* revoked) override;
  BlockIndex* blocks() override { return &blocks_; }

  // Cross-checks all bookkeeping (tests and the fuzzer): allocator invariants, per-worker and
  // per-pool byte accounting, slots present exactly for pages in T1/T2, figure totals.
  absl::Status CheckInvariants() const;

 private:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterLocked(const v1::RegisterWorkerRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `channel_peer`: the kernel's word on a heartbeat that came over the memory channel (its uid
  // must be the worker's); null for the RPC. Takes lease_mu_ only.
  absl::StatusOr<v1::HeartbeatResponse> RenewLease(const v1::HeartbeatRequest& r,
                                                   const edge::PeerCredentials* channel_peer)
      ABSL_LOCKS_EXCLUDED(mu_, lease_mu_);
  absl::StatusOr<v1::OpenSequenceResponse> OpenLocked(const v1::OpenSequenceRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitSnapshot's phases (daemon_snapshot.cc). `prep` carries what the unlocked phase needs.
  struct Prepared;
  // `channel_peer`: who sent it over the memory channel; null over gRPC.
  absl::StatusOr<v1::TierPlan> TimedSnapshot(const v1::SubmitSnapshotRequest& r,
                                             const edge::PeerCredentials* channel_peer);
  absl::StatusOr<v1::TierPlan> Snapshot(const v1::SubmitSnapshotRequest& r,
                                        const edge::PeerCredentials* channel_peer);
  // Authenticates (as the worker's uid, over the channel), settles a carried ack, answers a
  // replay, checks the versions and copies the record: fills `prep` (or `replay`, the plan in
  // flight, for the same snapshot again). The O(entries) validation runs after, without mu_.
  absl::Status PrepareLocked(const v1::SubmitSnapshotRequest& r,
                             const edge::PeerCredentials* channel_peer, uint64_t fingerprint,
                             SequenceRec& s, Prepared& prep,
                             std::shared_ptr<const v1::TierPlan>& replay)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Extents per pool that granting `prep`'s destinations would create for lack of a ready spare:
  // charged to the budgets (PoolBudget::BeginSpare) for the caller to make without the lock.
  std::array<uint32_t, 2> ExtentsToMakeLocked(const SequenceRec& s, const Prepared& prep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes one charged spare of `budget` (slow: memfd, fallocate) and files it. REQUIRES: mu_ not
  // held, one BeginSpare charged.
  bool MakeSpare(PoolBudget& budget) ABSL_LOCKS_EXCLUDED(mu_);
  // Grants the target's destinations (degrading `prep`'s target where short), builds the wire
  // plan and records it as the plan in flight. NOT_FOUND when the sequence was freed meanwhile.
  absl::StatusOr<std::shared_ptr<v1::TierPlan>> PlanLocked(SequenceRec& s, Prepared& prep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ordered moves, figures and the wire plan. RESOURCE_EXHAUSTED when the plan would exceed the
  // message limit (then nothing is recorded).
  absl::Status BuildPlanLocked(const WorkerRec& w, const SequenceRec& s, const SlotMap& dst,
                               Prepared& prep, v1::TierPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountPlan(const Prepared& prep) const;  // metrics_ must be set
  // What the prefetch schedule of a plan whose target is `target` may use (daemon_schedule.cc),
  // for a worker that declared a link: its share of the link now and this sequence's part of
  // it. O(workers on the link); the page lists are built after mu_ is released (Snapshot).
  // Records nothing: PlanLocked files the figures once the plan is made.
  struct ScheduleFigures {
    uint64_t scheduled_bytes = 0;  // the target's T1/T2 bytes
    uint64_t pooled_pages = 0;
    double h2d_grant = 0;  // the worker's share of its link
    double step_seconds = 0;
    SequenceBudget budget;
  };
  ScheduleFigures ScheduleLocked(const WorkerRec& w, const SequenceRec& s,
                                 const tiering::Placement& target) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Scopes a registering worker's validated link (ScopeLink: the operator's [links] table, else
  // the worker's uid) and checks it against the workers already in that scope.
  absl::Status ScopeLinkLocked(uint32_t uid, LinkDecl& link) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::AckPlanResponse> AckLocked(const v1::AckPlanRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::CloseSequenceResponse> CloseLocked(const v1::CloseSequenceRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetStatus copies what it shows under mu_ (StatusRowsLocked) and builds the reply without it.
  struct StatusRows;
  // `local_operator`: the daemon's own view (its status page), every worker and sequence.
  v1::GetStatusResponse StatusFor(const v1::GetStatusRequest& r, bool local_operator);
  StatusRows StatusRowsLocked(const v1::GetStatusRequest& r, bool local_operator)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rows of the workers and sequences `all` (or worker `own`'s) shows, with the links they
  // use (daemon_status.cc).
  void ListLocked(bool all, uint64_t own, const v1::GetStatusRequest& r, absl::Duration now,
                  StatusRows& rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::ChannelReply> HelloLocked(const edge::PeerCredentials& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::ChannelReply> FetchLocked(const edge::PeerCredentials& peer,
                                               const v1::FetchExtents& r,
                                               std::vector<edge::UniqueFd>* fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the worker's memory of both pools (sealed headers; extents come on demand).
  // Each pool's memory for a worker that asked for `want` (RegisterWorkerRequest.pool_memory).
  absl::StatusOr<std::array<ExtentMemory, 2>> MemoryFor(v1::PoolMemory want) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateMemoryLocked(WorkerRec& w, const std::array<ExtentMemory, 2>& memory)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The unexpired ticket `t` (consumed when `consume`); PERMISSION_DENIED naming `field`.
  absl::StatusOr<Ticket> RedeemTicketLocked(const std::string& t, bool consume,
                                            absl::string_view field)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The live worker `id` whose session secret is `secret`, lease renewed (and, for a request
  // `via` the gRPC socket, its last call). NOT_FOUND for ids never issued by this daemon,
  // PERMISSION_DENIED for a secret that does not match (nothing is changed, not even the lease),
  // FAILED_PRECONDITION for expired ones (reaped first).
  enum class Via { kRpc, kChannel };
  absl::StatusOr<WorkerRec*> AuthenticateLocked(uint64_t id, const std::string& secret,
                                                Via via = Via::kRpc)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's sequence: NOT_FOUND when unknown, PERMISSION_DENIED when another worker's.
  absl::StatusOr<std::shared_ptr<SequenceRec>> FindSequenceLocked(const WorkerRec& w,
                                                                  uint64_t sequence_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether worker `id`'s lease is gone or older than the TTL (by the injected clock).
  bool LeaseExpiredLocked(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu_);
  // The worker's reported step time (0 = none); 0 for a worker without a lease.
  double StepSecondsLocked(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu_);
  // Refuses a snapshot whose growth would take worker `w` or the node past its budget of held
  // snapshot entries (RESOURCE_EXHAUSTED naming the limit, the value and the ceiling).
  absl::Status CheckEntryBudgetLocked(const WorkerRec& w, const SequenceRec& s,
                                      uint64_t entries) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees every slot of a sequence (committed and pending) and forgets it. Returns slots freed.
  uint64_t FreeSequenceLocked(WorkerRec& w, uint64_t sequence_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeWorkerLocked(uint64_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Pool memory of ended sessions (daemon_draining.cc). RetireMemoryLocked: a freed worker's
  // extents (every slot released) go back to the budget, or, those some process may still hold,
  // to draining_. ReleaseDrainedLocked: returns the draining extents nobody holds any more; the
  // number of extents released.
  void RetireMemoryLocked(WorkerRec& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ReleaseDrainedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether some process other than the daemon may still hold `e`: the kernel's word where it
  // has one, else whether any of `holders` (the processes that received it) is alive.
  bool ExtentHeldLocked(const Extent& e,
                        const std::vector<std::shared_ptr<const edge::PeerProcess>>& holders) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the peer's process (a pidfd) as a holder of `w`'s extents. FAILED_PRECONDITION when
  // `w` was handed to too many live processes, or, when `required` (extents the kernel cannot
  // say are let go of: CUDA VMM), the daemon cannot watch the process (no pidfd).
  absl::Status AddHolderLocked(WorkerRec& w, const edge::PeerCredentials& peer, bool required)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the session of every worker whose peer options_.security no longer allows (a reload),
  // as CloseWorker would, and remembers why for its later requests; one line each in `revoked`.
  void RevokeDisallowedLocked(std::vector<std::string>* revoked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `peer` may register under `sec` (OK), else PERMISSION_DENIED naming the rule.
  absl::Status AllowedLocked(const SecurityOptions& sec, const edge::PeerCredentials& peer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Slots charged to a worker: nullopt (and the reason) when the pool or the quota is short.
  std::optional<Slot> GrantLocked(WorkerRec& w, tiering::Tier tier, bool count_failures,
                                  Metrics::DegradeReason* reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destination slots for the pages `need` (in that order) moving into a pool; where a pool or
  // quota is short, degrades target[i] (compress instead if the policy may, else keep the
  // current tier). dst[i] receives each granted slot.
  Shortage GrantLocked(WorkerRec& w, const PolicySpec& policy, const tiering::Placement& current,
                       absl::Span<const uint32_t> need, bool count_failures,
                       tiering::Placement& target, SlotMap& dst) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants destination slots for every page `target` moves into a pool (indexed like the
  // placement), degrading `target` where short; `shortage` says what was short.
  SlotMap GrantDestinationsLocked(WorkerRec& w, const SequenceRec& s,
                                  absl::Span<const float> scores, tiering::Placement& target,
                                  Shortage* shortage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(WorkerRec& w, Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int PoolOf(const Slot& slot) { return slot.allocator()->tag(); }

  // Takes the entries of `prep`'s grown placement (CheckEntryBudgetLocked) and adopts it into
  // the record: pages it has evicted (the worker evicted them while the daemon was out of
  // reach) give their slots back, the rest keep them under their new index. NOT_FOUND when the
  // sequence was freed meanwhile.
  absl::Status AdoptLocked(SequenceRec& s, const Prepared& prep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetFiguresLocked(SequenceRec& s, const PlacementFigures& f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked(WorkerRec& w, SequenceRec& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles the plan in flight (AckPlan, or the ack a snapshot carries); `field` names the
  // request field holding `version` in the error.
  absl::Status AcknowledgeLocked(WorkerRec& w, SequenceRec& s, uint64_t version, bool applied,
                                 absl::string_view field) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the request (and its error) in the metrics; returns `result` unchanged.
  template <typename T>
  absl::StatusOr<T> Count(Metrics::Rpc rpc, absl::StatusOr<T> result) {
    if (metrics_ != nullptr) {
      metrics_->CountRequest(rpc);
      if (!result.ok()) metrics_->CountError(rpc, result.status().code());
    }
    return result;
  }

  Clock* const clock_;
  Metrics* const metrics_;
  const CoreHooks hooks_;
  const uint64_t epoch_;
  const absl::Duration start_;
  const uint64_t id_base_;
  const uid_t daemon_uid_;
  const gid_t daemon_gid_;
  // Budgets are declared before the registry, which holds extents charged to them.
  std::array<std::unique_ptr<PoolBudget>, 2> pools_;
  BlockIndex blocks_;  // its own lock; asks [security] through mu_

  // Priority inheritance: the heartbeat lane's real-time thread takes it (pi_mutex.h).
  mutable PiMutex mu_;
  CoreOptions options_ ABSL_GUARDED_BY(mu_);
  uint64_t next_worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, WorkerRec> workers_ ABSL_GUARDED_BY(mu_);
  // Shared: a snapshot in progress keeps its record (and plan_mu) alive across unlocked phases.
  absl::flat_hash_map<uint64_t, std::shared_ptr<SequenceRec>> sequences_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Ticket> tickets_ ABSL_GUARDED_BY(mu_);
  std::vector<DrainingMemory> draining_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, 2> draining_bytes_ ABSL_GUARDED_BY(mu_){};
  // Workers whose uid a reload removed from [security]: their requests are PERMISSION_DENIED
  // with this reason (bounded: the oldest are forgotten, then answer "lease expired").
  // Under lease_mu_, so that a heartbeat (which takes only that lock) hears it too.
  absl::flat_hash_map<uint64_t, std::string> revoked_ ABSL_GUARDED_BY(lease_mu_);
  // Slot bytes and slots granted, node-wide, per pool.
  std::array<uint64_t, 2> used_bytes_ ABSL_GUARDED_BY(mu_){};
  std::array<uint64_t, 2> slots_used_ ABSL_GUARDED_BY(mu_){};
  // Sums over open sequences' acknowledged placements.
  std::array<uint64_t, tiering::kNumTiers> total_tokens_ ABSL_GUARDED_BY(mu_){};
  uint64_t total_full_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_t0_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_entries_ ABSL_GUARDED_BY(mu_) = 0;  // sum of WorkerRec::entries

  // Leases, apart from the registry (see the class comment). Priority inheritance: the heartbeat
  // lane's real-time thread takes it.
  mutable PiMutex lease_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(lease_mu_);
  // Copies of options_' lease settings (Reload writes both under both locks).
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(lease_mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(lease_mu_);
  // Worker ids below this were issued by this daemon (a heartbeat's "expired" vs "unknown").
  uint64_t issued_below_ ABSL_GUARDED_BY(lease_mu_) = 0;
  // A copy of options_.max_sequences_per_worker: the most sizes one heartbeat may carry.
  uint32_t max_sizes_ ABSL_GUARDED_BY(lease_mu_) = 0;
};

}  // namespace kvtier::daemon::internal

#endif  // KVTIER_DAEMON_DAEMON_CORE_IMPL_H_
