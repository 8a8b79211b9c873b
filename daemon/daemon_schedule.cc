// DaemonCoreImpl: prefetch schedules (docs/scheduling.md) — a worker's share of its host link
// and the schedule of each plan it gets.

#include <vector>

#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"

namespace kvtier::daemon::internal {

absl::StatusOr<LinkDecl> DaemonCoreImpl::ValidateLinkLocked(
    const v1::RegisterWorkerRequest& r) const {
  ASSIGN_OR_RETURN(LinkDecl link, ValidateLink(r));
  if (!link.declared() || link.id.empty()) return link;
  for (const auto& [id, w] : workers_) {
    if (w.link.declared() && w.link.id == link.id) RETURN_IF_ERROR(CheckSameLink(link, w.link, id));
  }
  return link;
}

DaemonCoreImpl::ScheduleFigures DaemonCoreImpl::ScheduleLocked(
    const WorkerRec& w, const SequenceRec& s, const tiering::Placement& target) const {
  const double assumed = absl::ToDoubleSeconds(options_.assumed_step);
  auto member = [&](const WorkerRec& m, uint64_t pooled) {
    return LinkMember{m.link.bytes_per_second, pooled, m.link.staging_bytes,
                      m.step_seconds > 0 ? m.step_seconds : assumed, m.h2d_grant};
  };
  ScheduleFigures f;
  const Pooled pooled = PooledPages(target, w.page_bytes);
  f.scheduled_bytes = pooled.bytes;
  f.pooled_pages = pooled.pages;
  // What the worker holds with this plan's target in place of the sequence's last one.
  const uint64_t worker_pooled = w.scheduled_bytes - s.scheduled_bytes + f.scheduled_bytes;
  std::vector<LinkMember> members = {member(w, worker_pooled)};
  if (!w.link.id.empty()) {
    for (const auto& [id, other] : workers_) {
      if (id != w.id && other.link.declared() && other.link.id == w.link.id) {
        members.push_back(member(other, other.scheduled_bytes));
      }
    }
  }
  f.h2d_grant = LinkGrant(members, 0);
  f.step_seconds = members[0].step_seconds;
  f.budget = ShareOfWorker(f.h2d_grant, f.step_seconds, w.link.staging_bytes, f.scheduled_bytes,
                           worker_pooled);
  return f;
}

}  // namespace kvtier::daemon::internal
