#ifndef KVTIER_CORE_TIERING_SCHEDULE_H_
#define KVTIER_CORE_TIERING_SCHEDULE_H_

// Prefetch schedules (DESIGN.md §3): how a worker's T1 pages reach attention each decode step —
// kept resident in its staging area across steps, restaged over PCIe within a per-step byte
// budget, or attended in place in host DDR by the CPU (split attention) — and how one PCIe
// link's bandwidth is divided between the GPUs behind it. Pure functions: the daemon's
// schedules and the node-scale simulator (bench/sim) run the same code. A schedule never moves
// a page between tiers and never evicts: it only says where a T1/T2 page is read from.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::tiering {

// One GPU's claim on a link: the host-to-device bytes per second it would use if it could.
struct LinkDemand {
  uint32_t link = 0;  // index into the links' capacities
  double bytes_per_second = 0;
};

// Max-min fair shares (water-filling) per demand, in bytes per second: no GPU gets more than it
// asked for, the shares on a link never add up to more than its capacity, and what one GPU
// leaves unused goes to the others on its link. INVALID_ARGUMENT for a demand naming a link that
// does not exist, or a negative or non-finite capacity or demand.
absl::StatusOr<std::vector<double>> ShareLinks(absl::Span<const double> link_bytes_per_second,
                                               absl::Span<const LinkDemand> demands);

// A T1 (or T2) page of the step's attention: its cumulative score and its bytes on the wire.
struct SchedulePage {
  float score = 0;
  uint64_t bytes = 0;
};

struct ScheduleBudget {
  uint64_t staging_bytes = 0;       // the worker's staging area: pages kept across steps
  uint64_t h2d_bytes_per_step = 0;  // this worker's share of its link for one step
};

// Where each page is read from in one step, by index into the pages given. The hottest pages
// are kept resident (a score ranks them, as in tiering), the next are staged in that order
// until the per-step budget is spent, and the rest are attended in place. A page that does not
// fit its class goes to the next one; nothing is dropped.
struct StepSchedule {
  std::vector<uint32_t> resident, staged, in_place;
  uint64_t resident_bytes = 0, staged_bytes = 0, in_place_bytes = 0;
};

StepSchedule SchedulePages(absl::Span<const SchedulePage> pages, const ScheduleBudget& budget);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_SCHEDULE_H_
