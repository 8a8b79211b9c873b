// DaemonCoreImpl: prefetch schedules (docs/scheduling.md) — a worker's share of its host link
// and the schedule of each plan it gets.

#include <algorithm>
#include <vector>

#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"

namespace kvtier::daemon::internal {

absl::Status DaemonCoreImpl::ScopeLinkLocked(uint32_t uid, LinkDecl& link) const {
  ScopeLink(options_.links, uid, link);
  if (link.scope.empty()) return absl::OkStatus();
  for (const auto& [id, w] : workers_) {
    if (w.link.scope == link.scope) RETURN_IF_ERROR(CheckSameLink(link, w.link));
  }
  return absl::OkStatus();
}

DaemonCoreImpl::ScheduleFigures DaemonCoreImpl::ScheduleLocked(
    const WorkerRec& w, const SequenceRec& s, const tiering::Placement& target) const {
  const double assumed = absl::ToDoubleSeconds(options_.assumed_step);
  PiMutexLock lease_lock(&lease_mu_);  // for the members' step times
  auto member = [&](const WorkerRec& m, uint64_t pooled) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const double step = StepSecondsLocked(m.id);
    return LinkMember{m.link.capacity, pooled, m.link.staging_bytes, step > 0 ? step : assumed,
                      m.h2d_grant};
  };
  ScheduleFigures f;
  const Pooled pooled = PooledPages(target, w.page_bytes);
  f.scheduled_bytes = pooled.bytes;
  f.pooled_pages = pooled.pages;
  // What the worker holds with this plan's target in place of the sequence's last one.
  const uint64_t worker_pooled = w.scheduled_bytes - s.scheduled_bytes + f.scheduled_bytes;
  std::vector<LinkMember> members = {member(w, worker_pooled)};
  if (!w.link.scope.empty()) {
    for (const auto& [id, other] : workers_) {
      if (id != w.id && other.link.scope == w.link.scope) {
        members.push_back(member(other, other.scheduled_bytes));
      }
    }
  }
  // A worker that declared less than its link carries is held to its own figure (only its own).
  f.h2d_grant = std::min(LinkGrant(members, 0), w.link.bytes_per_second);
  f.step_seconds = members[0].step_seconds;
  f.budget = ShareOfWorker(f.h2d_grant, f.step_seconds, w.link.staging_bytes, f.scheduled_bytes,
                           worker_pooled);
  return f;
}

}  // namespace kvtier::daemon::internal
