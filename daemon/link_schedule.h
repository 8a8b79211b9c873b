#ifndef KVTIER_DAEMON_LINK_SCHEDULE_H_
#define KVTIER_DAEMON_LINK_SCHEDULE_H_

// The daemon's side of prefetch schedules (docs/scheduling.md): what a worker may declare of
// its host link, how a link's bandwidth is divided between the workers behind it, and how a
// plan's target becomes a schedule. The arithmetic is core/tiering/schedule.h's; this file
// speaks the contract. Pure; thread-compatible.

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/types.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// The most a host link can carry host-to-device (PCIe 6.0 x16 is ~121 GB/s, NVLink-C2C
// ~450 GB/s a direction): anything above is a unit error, not a link.
inline constexpr double kMaxLinkBytesPerSecond = 1e12;
inline constexpr double kMaxStepSeconds = 600;

// What a worker declared at registration; bytes_per_second 0 = nothing declared.
struct LinkDecl {
  std::string id;  // "" = a link of its own
  double bytes_per_second = 0;
  uint32_t numa_node = 0;
  uint64_t staging_bytes = 0;
  // Set by the daemon, not the worker: the workers whose scopes are equal share one link ("" =
  // none), and what that link carries. A link of the operator's table ([links]) is one scope
  // with the table's bandwidth and NUMA node; any other link_id is scoped to the declaring uid,
  // so that no tenant's declaration refuses or throttles another's workers.
  std::string scope;
  double capacity = 0;
  bool declared() const { return bytes_per_second > 0; }
};

// The request's link, checked: INVALID_ARGUMENT naming the field and value for a non-finite,
// negative or too-large bandwidth, a NUMA node >= 1024, staging beyond the GPU's memory, or a
// link_id that is too long or not printable.
absl::StatusOr<LinkDecl> ValidateLink(const v1::RegisterWorkerRequest& r);
// A heartbeat's step_seconds: finite and in [0, kMaxStepSeconds].
absl::Status ValidateStepSeconds(double step_seconds);
// Two workers of one uid on one link_id must agree on its NUMA node (a PCIe switch hangs off one
// root complex): INVALID_ARGUMENT naming the field, both figures and the link otherwise (never
// the other worker: its id is no business of the joining one's).
absl::Status CheckSameLink(const LinkDecl& joining, const LinkDecl& present);
// Scopes a validated declaration of a worker of `uid` (LinkDecl::scope, capacity): an entry of
// the operator's `table` with its link_id sets the link's bandwidth and NUMA node whatever was
// declared; otherwise the link is this uid's alone.
template <typename Table>
void ScopeLink(const Table& table, uint32_t uid, LinkDecl& link) {
  if (!link.declared() || link.id.empty()) return;
  for (const auto& entry : table) {
    if (entry.id != link.id) continue;
    link.scope = "operator:" + link.id;
    link.capacity = entry.bytes_per_second;
    link.numa_node = entry.numa_node;
    return;
  }
  link.scope = "uid " + std::to_string(uid) + ":" + link.id;
  link.capacity = link.bytes_per_second;
}

// One worker behind a link, as the grant sees it.
struct LinkMember {
  double link_bytes_per_second = 0;  // its declaration
  uint64_t pooled_bytes = 0;         // T1/T2 bytes of its sequences' latest targets
  uint64_t staging_bytes = 0;
  double step_seconds = 0;  // effective (reported, or the assumed figure)
  double granted = 0;       // the grant its schedules follow now (bytes per second)
};

// Bytes per second granted to members[self]: the link's capacity is the smallest figure its
// members declared, each member asks for what restaging its pooled bytes beyond its staging
// area every step would take, and the capacity is shared max-min fairly (ShareLinks). The
// others keep following their grants until their next plans, so members[self] gets at most
// what they leave: the grants in force on a link never add up to more than it carries, and
// they reach the fair shares within two re-tiering rounds of a change.
double LinkGrant(absl::Span<const LinkMember> members, size_t self);

// One sequence's share of its worker's grant and staging area, by its pooled bytes.
struct SequenceBudget {
  uint64_t h2d_bytes_per_step = 0;
  uint64_t staging_bytes = 0;
};
SequenceBudget ShareOfWorker(double grant_bytes_per_second, double step_seconds,
                             uint64_t worker_staging_bytes, uint64_t sequence_pooled_bytes,
                             uint64_t worker_pooled_bytes);

// The T1/T2 pages of a placement and their bytes: page_bytes per pool (index 0 = T1, 1 = T2).
struct Pooled {
  uint64_t pages = 0, bytes = 0;
};
Pooled PooledPages(const tiering::Placement& p, const std::array<uint64_t, 2>& page_bytes);

// An upper bound of the serialized schedule of `pooled_pages` T1/T2 pages over `groups`.
uint64_t ScheduleBytesBound(uint32_t groups, uint64_t pooled_pages);

// The schedule of a target placement: every T1/T2 page in exactly one list of its group,
// ranked by `scores` (group-major, as the snapshot's) — resident, then staged in the order to
// issue, then in place. T0 and T3 pages never appear.
void BuildSchedule(const tiering::Placement& target, absl::Span<const float> scores,
                   const std::array<uint64_t, 2>& page_bytes, const SequenceBudget& budget,
                   v1::PrefetchSchedule* out);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_LINK_SCHEDULE_H_
