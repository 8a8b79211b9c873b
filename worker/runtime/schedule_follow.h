#ifndef KVTIER_WORKER_RUNTIME_SCHEDULE_FOLLOW_H_
#define KVTIER_WORKER_RUNTIME_SCHEDULE_FOLLOW_H_

// A worker's reading of the daemon's prefetch schedule (docs/scheduling.md): checked against
// the store's placement before anything follows it.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/v1/kvtier.pb.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

// A schedule the store can follow: the pages each group attends in place, and the bytes of
// each class in one step.
struct FollowedSchedule {
  StageSchedule pages;  // the lists [group] (stage in the schedule's order) and the budgets
  uint64_t resident_bytes = 0, stage_bytes = 0, in_place_bytes = 0;
};

// INVALID_ARGUMENT naming the group and page (and the field) for a schedule that does not match
// the store: other than layer_groups groups, a page that does not exist or is not in T1/T2, a
// page listed twice or a T1/T2 page not listed, resident pages beyond staging_bytes or staged
// pages beyond h2d_bytes_per_step.
absl::StatusOr<FollowedSchedule> CheckSchedule(const v1::PrefetchSchedule& schedule,
                                               const TieredKvStore& store);

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_SCHEDULE_FOLLOW_H_
