// DaemonCoreImpl: GetStatus — node totals, pools, and the workers, sequences and links the caller
// may see. Copied under mu_ in one go (a consistent view); the reply is built without it.

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon_core_impl.h"
#include "edge/session.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "0.0.0"
#endif

namespace kvtier::daemon::internal {
namespace {

uint64_t Ms(absl::Duration d) {
  return d > absl::ZeroDuration() ? static_cast<uint64_t>(absl::ToInt64Milliseconds(d)) : 0;
}

}  // namespace

struct DaemonCoreImpl::StatusRows {
  v1::GetStatusResponse head;  // everything but the lists
  struct Worker {
    uint64_t id = 0;
    std::string name, model_name;
    int32_t pid = 0;
    uint32_t uid = 0, sequences = 0;
    std::array<uint64_t, 2> pool_bytes{};
    uint64_t lease_remaining_ms = 0, lease_age_ms = 0, session_age_ms = 0;
    std::string link_id;
    double h2d_grant = 0, step_seconds = 0;
    uint64_t plans = 0, degraded_plans = 0;
    double plans_per_second = 0;
  };
  struct Sequence {
    uint64_t id = 0, worker_id = 0, length = 0, snapshot_length = 0, plan_version = 0;
    std::string tag, policy;
    PlacementFigures figures;
    uint64_t plans = 0, degraded_plans = 0;
    double plans_per_second = 0;
    std::array<uint64_t, 2> pool_bytes{};
    v1::SequenceLostMass lost_mass;
  };
  std::vector<Worker> workers;
  std::vector<Sequence> sequences;
  std::vector<v1::LinkStatus> links;
};

absl::StatusOr<v1::GetStatusResponse> DaemonCoreImpl::GetStatus(
    const v1::GetStatusRequest& request) {
  return Count(Metrics::Rpc::kGetStatus,
               absl::StatusOr<v1::GetStatusResponse>(StatusFor(request, /*local_operator=*/false)));
}

v1::GetStatusResponse DaemonCoreImpl::OperatorStatus() {
  v1::GetStatusRequest request;
  request.set_include_workers(true);
  request.set_include_sequences(true);
  return StatusFor(request, /*local_operator=*/true);
}

v1::GetStatusResponse DaemonCoreImpl::StatusFor(const v1::GetStatusRequest& request,
                                                bool local_operator) {
  StatusRows rows;
  {
    PiMutexLock lock(&mu_);
    rows = StatusRowsLocked(request, local_operator);
  }
  v1::GetStatusResponse resp = std::move(rows.head);
  for (const StatusRows::Worker& w : rows.workers) {
    v1::WorkerStatus* ws = resp.add_worker_list();
    ws->set_worker_id(w.id);
    ws->set_worker_name(w.name);
    ws->set_pid(w.pid);
    ws->set_uid(w.uid);
    ws->set_model_name(w.model_name);
    ws->set_sequences(w.sequences);
    ws->set_ddr_bytes(w.pool_bytes[0]);
    ws->set_compressed_bytes(w.pool_bytes[1]);
    ws->set_lease_remaining_ms(w.lease_remaining_ms);
    ws->set_link_id(w.link_id);
    ws->set_h2d_grant_bytes_per_second(w.h2d_grant);
    ws->set_step_seconds(w.step_seconds);
    ws->set_plans(w.plans);
    ws->set_degraded_plans(w.degraded_plans);
    ws->set_plans_per_second(w.plans_per_second);
    ws->set_lease_age_ms(w.lease_age_ms);
    ws->set_session_age_ms(w.session_age_ms);
  }
  for (const StatusRows::Sequence& s : rows.sequences) {
    v1::SequenceStatus* ss = resp.add_sequence_list();
    ss->set_sequence_id(s.id);
    ss->set_worker_id(s.worker_id);
    ss->set_tag(s.tag);
    ss->set_policy(s.policy);
    ss->set_length(s.length);
    ss->set_plan_version(s.plan_version);
    s.figures.ToProto(ss->mutable_report());
    ss->set_plans(s.plans);
    ss->set_degraded_plans(s.degraded_plans);
    ss->set_plans_per_second(s.plans_per_second);
    ss->set_ddr_bytes(s.pool_bytes[0]);
    ss->set_compressed_bytes(s.pool_bytes[1]);
    ss->set_snapshot_length(s.snapshot_length);
    if (s.lost_mass.reports() != 0) *ss->mutable_lost_mass() = s.lost_mass;
  }
  for (v1::LinkStatus& l : rows.links) *resp.add_links() = std::move(l);
  return resp;
}

DaemonCoreImpl::StatusRows DaemonCoreImpl::StatusRowsLocked(const v1::GetStatusRequest& r,
                                                            bool local_operator) {
  const absl::Duration now = clock_->Now();
  // Draining extents let go of since the reaper last looked are shown returned, not draining.
  if (!draining_.empty()) ReleaseDrainedLocked();
  StatusRows rows;
  v1::GetStatusResponse& resp = rows.head;
  resp.set_version(KVTIER_VERSION);
  resp.set_daemon_epoch(epoch_);
  resp.set_uptime_ms(Ms(now - start_));
  resp.set_listen_address(options_.listen_address);
  resp.set_metrics_address(options_.metrics_address);
  resp.set_workers(static_cast<uint32_t>(workers_.size()));
  resp.set_sequences(static_cast<uint32_t>(sequences_.size()));
  for (int i = 0; i < 2; ++i) {
    const PoolBudget& pool = *pools_[i];
    v1::PoolStatus* p = resp.add_pools();
    p->set_kind(WireKind(pool.kind()));
    p->set_shm_name(absl::StrCat("memfd:", pool.label(), " (", pool.extents_out(), " x ",
                                 pool.extent_bytes() >> 20, " MiB extents)"));
    p->set_capacity_bytes(pool.capacity());
    p->set_used_bytes(used_bytes_[i]);
    p->set_slots_used(slots_used_[i]);
    p->set_draining_bytes(draining_bytes_[i]);
    p->set_reserved_bytes(pool.reserved_bytes());
  }
  resp.set_hbm_saved_bytes(total_full_bytes_ - total_t0_bytes_);
  // Whose workers and sequences the caller may see: an operator's, its own, or none.
  bool all = local_operator;
  uint64_t own = 0;
  if (!all && !r.operator_ticket().empty()) {
    absl::StatusOr<Ticket> t = RedeemTicketLocked(r.operator_ticket(), false, "operator_ticket");
    all = t.ok() && t->operator_view;
  }
  if (!all && r.worker_id() != 0) {
    auto it = workers_.find(r.worker_id());
    if (it != workers_.end() && edge::SecretsEqual(r.session_secret(), it->second.secret)) {
      own = it->first;
    }
  }
  resp.set_view(all ? "all" : own != 0 ? "own" : "none");
  ListLocked(all, own, r, now, rows);
  return rows;
}

void DaemonCoreImpl::ListLocked(bool all, uint64_t own, const v1::GetStatusRequest& r,
                                absl::Duration now, StatusRows& rows) {
  if (!r.include_workers() && !r.include_sequences()) return;
  PiMutexLock lease_lock(&lease_mu_);
  if (r.include_workers()) {
    std::map<std::string, v1::LinkStatus> links;  // by scope, so the list comes out sorted
    for (const auto& [id, w] : workers_) {
      if (!all && id != own) continue;
      auto lease = leases_.find(id);
      const bool live = lease != leases_.end();
      rows.workers.push_back({id, w.name, w.model_name, w.pid, w.peer.uid,
                              static_cast<uint32_t>(w.sequences.size()), w.pool_bytes,
                              live ? Ms(lease->second.last_seen + lease_ttl_ - now) : 0,
                              live ? Ms(now - lease->second.last_seen) : 0, Ms(now - w.registered),
                              w.link.id, w.h2d_grant, StepSecondsLocked(id), w.plans.plans,
                              w.plans.degraded, w.plans.rate.PerSecond(now)});
      if (w.link.scope.empty()) continue;
      v1::LinkStatus& l = links[w.link.scope];
      const bool first = l.workers() == 0;
      l.set_link_id(w.link.id);
      l.set_scope(absl::StartsWith(w.link.scope, "operator:") ? "operator"
                                                              : absl::StrCat("uid ", w.peer.uid));
      // The grant divides the smallest figure a member declared (LinkGrant).
      l.set_bytes_per_second(first ? w.link.capacity
                                   : std::min(l.bytes_per_second(), w.link.capacity));
      l.set_granted_bytes_per_second(l.granted_bytes_per_second() + w.h2d_grant);
      l.set_workers(l.workers() + 1);
      l.set_numa_node(w.link.numa_node);
    }
    for (auto& [scope, l] : links) rows.links.push_back(std::move(l));
  }
  if (r.include_sequences()) {
    for (const auto& [id, s] : sequences_) {
      if (!all && s->worker_id != own) continue;
      const WorkerRec& w = workers_.at(s->worker_id);  // an open sequence's worker is registered
      // The latest length heard: the snapshot's, the open's or a heartbeat's.
      uint64_t length = std::max(s->length, s->open_length);
      if (auto lease = leases_.find(s->worker_id); lease != leases_.end()) {
        if (auto l = lease->second.lengths.find(id); l != lease->second.lengths.end()) {
          length = std::max(length, l->second);
        }
      }
      std::array<uint64_t, 2> pool_bytes{};
      for (const auto& [index, slot] : s->slots) pool_bytes[PoolOf(slot)] += slot.bytes();
      rows.sequences.push_back(
          {id, s->worker_id, length, s->length, s->last_applied, s->tag, s->policy.name,
           GrowFigures(w.geometry, s->figures, s->prompt_tokens, s->length, length), s->plans.plans,
           s->plans.degraded, s->plans.rate.PerSecond(now), pool_bytes, s->lost_mass});
    }
  }
}

}  // namespace kvtier::daemon::internal
