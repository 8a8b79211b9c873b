#ifndef KVTIER_WORKER_CUDA_DEVICE_SCHEDULE_H_
#define KVTIER_WORKER_CUDA_DEVICE_SCHEDULE_H_

// A prefetch schedule as the CUDA backend follows it (docs/cuda.md, "Schedules and split
// attention"): what happens to each T1/T2 page of a group before its attention. Resident pages
// stay in the stager's resident area across steps; stage pages are copied into the layer's
// staging slot in the schedule's order, as many as fit the per-step byte budget (the rest, and
// the schedule's in-place pages, are attended by the CPU from pool memory: split attention);
// pages the schedule does not name are staged whole, as without one. Pure host logic.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv_backend.h"

namespace kvtier::worker::cuda {

enum class PageRole : uint8_t { kWhole = 0, kResident, kStage, kInPlace };

// What a page costs the device.
struct DevicePageBytes {
  uint64_t block = 0;             // one layer's staged block (dequantized for T2)
  uint64_t compressed_block = 0;  // one layer's copy of a T2 page (codes)
};

class DeviceSchedule {
 public:
  DeviceSchedule() = default;  // none: every page staged whole

  // INVALID_ARGUMENT naming the field, the value and the limit, for a page the store does not
  // hold in T1/T2, resident pages whose staged blocks exceed staging_bytes, or staging_bytes
  // below one page's staged blocks when any page is to be staged.
  static absl::StatusOr<DeviceSchedule> Make(const StageSchedule& schedule,
                                             const std::vector<std::vector<StoredPage>>& pages,
                                             const layout::KvGeometry& geometry,
                                             const DevicePageBytes& bytes);

  bool empty() const { return roles_.empty(); }
  PageRole RoleOf(uint32_t group, uint32_t page) const {
    return group < roles_.size() && page < roles_[group].size() ? roles_[group][page]
                                                                : PageRole::kWhole;
  }
  // The stage pages kept, in the schedule's order.
  const std::vector<uint32_t>& StageOrder(uint32_t group) const { return stage_[group]; }
  uint32_t max_resident() const { return max_resident_; }  // most resident pages of one group
  uint64_t stage_bytes() const { return stage_bytes_; }    // host-to-device bytes of one step
  uint32_t cut() const { return cut_; }  // stage pages over the budget, attended in place

 private:
  std::vector<std::vector<PageRole>> roles_;  // [group][page]
  std::vector<std::vector<uint32_t>> stage_;  // [group]
  uint32_t max_resident_ = 0;
  uint64_t stage_bytes_ = 0;
  uint32_t cut_ = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_DEVICE_SCHEDULE_H_
