#include "worker/cuda/device_schedule.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {

using tiering::Tier;

absl::StatusOr<DeviceSchedule> DeviceSchedule::Make(
    const StageSchedule& schedule, const std::vector<std::vector<StoredPage>>& pages,
    const layout::KvGeometry& geometry, const DevicePageBytes& bytes) {
  DeviceSchedule out;
  if (schedule.empty()) return out;
  const uint32_t groups = geometry.layer_groups;
  out.roles_.resize(groups);
  out.stage_.resize(groups);
  for (uint32_t g = 0; g < groups; ++g) {
    out.roles_[g].assign(g < pages.size() ? pages[g].size() : 0, PageRole::kWhole);
  }
  // One page's staged blocks (every layer of its group, dequantized for T2).
  auto staged_bytes = [&](uint32_t g) { return bytes.block * geometry.LayersInGroup(g); };
  uint64_t resident_bytes = 0, one_page = std::numeric_limits<uint64_t>::max();
  struct List {
    const char* name;
    const std::vector<std::vector<uint32_t>>& lists;
    PageRole role;
  };
  const List lists[] = {{"resident", schedule.resident, PageRole::kResident},
                        {"stage", schedule.stage, PageRole::kStage},
                        {"in_place", schedule.in_place, PageRole::kInPlace}};
  for (const List& list : lists) {
    for (uint32_t g = 0; g < std::min<size_t>(groups, list.lists.size()); ++g) {
      uint32_t count = 0;
      for (uint32_t page : list.lists[g]) {
        const bool held = page < out.roles_[g].size() &&
                          (pages[g][page].tier == Tier::kT1 || pages[g][page].tier == Tier::kT2);
        if (!held) {
          return absl::InvalidArgumentError(absl::StrCat(
              "schedule ", list.name, " group ", g, " page ", page,
              " is not a T1/T2 page the store holds (", out.roles_[g].size(), " pages)"));
        }
        out.roles_[g][page] = list.role;
        if (list.role == PageRole::kInPlace) continue;
        one_page = std::min(one_page, staged_bytes(g));
        if (list.role == PageRole::kResident) {
          resident_bytes += staged_bytes(g);
          out.max_resident_ = std::max(out.max_resident_, ++count);
        }
      }
    }
  }
  if (one_page != std::numeric_limits<uint64_t>::max() && schedule.staging_bytes < one_page) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule staging_bytes ", schedule.staging_bytes,
                     " is below one page staged on the device (", one_page, " bytes)"));
  }
  if (resident_bytes > schedule.staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule resident pages take ", resident_bytes,
                     " bytes staged on the device, over staging_bytes ", schedule.staging_bytes));
  }
  // Stage pages in order while the step's budget lasts; from the first that does not fit on,
  // the CPU attends them in place.
  bool over = false;
  for (uint32_t g = 0; g < std::min<size_t>(groups, schedule.stage.size()); ++g) {
    for (uint32_t page : schedule.stage[g]) {
      const uint64_t copy =
          (pages[g][page].tier == Tier::kT2 ? bytes.compressed_block : bytes.block) *
          geometry.LayersInGroup(g);
      over = over || out.stage_bytes_ + copy > schedule.h2d_bytes_per_step;
      if (over) {
        out.roles_[g][page] = PageRole::kInPlace;
        ++out.cut_;
        continue;
      }
      out.stage_bytes_ += copy;
      out.stage_[g].push_back(page);
    }
  }
  return out;
}

}  // namespace kvtier::worker::cuda
