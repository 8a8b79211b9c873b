#include "daemon/link_schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tiering/schedule.h"

namespace kvtier::daemon {
namespace {

constexpr size_t kMaxLinkIdBytes = 128;
constexpr uint32_t kMaxNumaNodes = 1024;  // Linux's MAX_NUMNODES ceiling

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

}  // namespace

absl::StatusOr<LinkDecl> ValidateLink(const v1::RegisterWorkerRequest& r) {
  LinkDecl d;
  if (!r.has_link()) return d;
  const v1::HostLink& l = r.link();
  const double bps = l.link_bytes_per_second();
  if (!std::isfinite(bps) || bps < 0 || bps > kMaxLinkBytesPerSecond) {
    return Invalid("link.link_bytes_per_second",
                   absl::StrCat(bps, " is not a host link's bandwidth: must be in (0, ",
                                kMaxLinkBytesPerSecond, "] bytes/s (0 = none declared)"));
  }
  if (l.link_id().size() > kMaxLinkIdBytes) {
    return Invalid("link.link_id",
                   absl::StrCat("is ", l.link_id().size(), " bytes, at most ", kMaxLinkIdBytes));
  }
  for (unsigned char c : l.link_id()) {
    if (c < 0x21 || c > 0x7e) {
      return Invalid("link.link_id",
                     absl::StrCat("has byte ", int{c}, ": printable ASCII without spaces only"));
    }
  }
  if (l.numa_node() >= kMaxNumaNodes) {
    return Invalid("link.numa_node", absl::StrCat(l.numa_node(), " must be < ", kMaxNumaNodes));
  }
  if (r.gpu().total_bytes() > 0 && l.staging_bytes() > r.gpu().total_bytes()) {
    return Invalid("link.staging_bytes",
                   absl::StrCat(l.staging_bytes(), " exceeds the GPU's memory (gpu.total_bytes ",
                                r.gpu().total_bytes(), ")"));
  }
  d.id = l.link_id();
  d.bytes_per_second = bps;
  d.numa_node = l.numa_node();
  d.staging_bytes = l.staging_bytes();
  return d;
}

absl::Status ValidateStepSeconds(double step_seconds) {
  if (!std::isfinite(step_seconds) || step_seconds < 0 || step_seconds > kMaxStepSeconds) {
    return Invalid("step_seconds", absl::StrCat(step_seconds, " must be in [0, ", kMaxStepSeconds,
                                                "] (0 = not measured yet)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameLink(const LinkDecl& joining, const LinkDecl& present) {
  if (joining.numa_node == present.numa_node) return absl::OkStatus();
  return Invalid("link.numa_node",
                 absl::StrCat(joining.numa_node, " differs from NUMA node ", present.numa_node,
                              " that this uid's workers declared on link_id \"", joining.id,
                              "\": one link hangs off one NUMA node (an operator's [links] entry "
                              "for it overrides declarations)"));
}

double LinkGrant(absl::Span<const LinkMember> members, size_t self) {
  double capacity = members[self].link_bytes_per_second;
  double others = 0;
  std::vector<tiering::LinkDemand> demands;
  demands.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const LinkMember& m = members[i];
    capacity = std::min(capacity, m.link_bytes_per_second);
    if (i != self) others += m.granted;
    const uint64_t restage = m.pooled_bytes - std::min(m.pooled_bytes, m.staging_bytes);
    demands.push_back({0, static_cast<double>(restage) / m.step_seconds});
  }
  // Inputs are validated at registration and heartbeat, so ShareLinks cannot refuse them.
  absl::StatusOr<std::vector<double>> shares = tiering::ShareLinks({capacity}, demands);
  if (!shares.ok()) return 0.0;
  return std::max(0.0, std::min((*shares)[self], capacity - others));
}

SequenceBudget ShareOfWorker(double grant_bytes_per_second, double step_seconds,
                             uint64_t worker_staging_bytes, uint64_t sequence_pooled_bytes,
                             uint64_t worker_pooled_bytes) {
  const uint64_t whole = std::max(worker_pooled_bytes, sequence_pooled_bytes);
  if (whole == 0) return {};
  const double fraction = static_cast<double>(sequence_pooled_bytes) / static_cast<double>(whole);
  SequenceBudget b;
  b.h2d_bytes_per_step =
      static_cast<uint64_t>(std::floor(grant_bytes_per_second * step_seconds * fraction));
  b.staging_bytes =
      static_cast<uint64_t>(std::floor(static_cast<double>(worker_staging_bytes) * fraction));
  return b;
}

Pooled PooledPages(const tiering::Placement& p, const std::array<uint64_t, 2>& page_bytes) {
  Pooled pooled;
  for (tiering::Tier t : p.tiers) {
    if (t != tiering::Tier::kT1 && t != tiering::Tier::kT2) continue;
    ++pooled.pages;
    pooled.bytes += page_bytes[t == tiering::Tier::kT2 ? 1 : 0];
  }
  return pooled;
}

uint64_t ScheduleBytesBound(uint32_t groups, uint64_t pooled_pages) {
  // Four scalars (11 bytes each at most), per group a message and three packed lists (tag and
  // length, 6 bytes each), a varint of at most 5 bytes a page.
  return 4 * 11 + uint64_t{groups} * 4 * 6 + pooled_pages * 5;
}

void BuildSchedule(const tiering::Placement& target, absl::Span<const float> scores,
                   const std::array<uint64_t, 2>& page_bytes, const SequenceBudget& budget,
                   v1::PrefetchSchedule* out) {
  std::vector<tiering::SchedulePage> pages;
  std::vector<uint32_t> where;  // group-major index of pages[k]
  for (uint32_t i = 0; i < target.tiers.size(); ++i) {
    const tiering::Tier t = target.tiers[i];
    if (t != tiering::Tier::kT1 && t != tiering::Tier::kT2) continue;
    pages.push_back({scores[i], page_bytes[t == tiering::Tier::kT2 ? 1 : 0]});
    where.push_back(i);
  }
  const tiering::StepSchedule s = tiering::SchedulePages(
      pages,
      {.staging_bytes = budget.staging_bytes, .h2d_bytes_per_step = budget.h2d_bytes_per_step});
  out->set_h2d_bytes_per_step(budget.h2d_bytes_per_step);
  out->set_staging_bytes(budget.staging_bytes);
  for (uint32_t g = 0; g < target.num_groups; ++g) out->add_groups();
  auto file = [&](const std::vector<uint32_t>& ids, auto add) {
    for (uint32_t k : ids) {
      const uint32_t i = where[k];
      add(out->mutable_groups(static_cast<int>(i / target.num_pages)), i % target.num_pages);
    }
  };
  file(s.resident, [](v1::GroupSchedule* g, uint32_t p) { g->add_resident(p); });
  file(s.staged, [](v1::GroupSchedule* g, uint32_t p) { g->add_stage(p); });
  file(s.in_place, [](v1::GroupSchedule* g, uint32_t p) { g->add_in_place(p); });
}

}  // namespace kvtier::daemon
