// TieredKvStore: the pages a prefetch schedule leaves in host memory (attended there by the
// backend as a second partial: split attention).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

using tiering::Tier;

absl::Status TieredKvStore::SetInPlacePages(const std::vector<std::vector<uint32_t>>& in_place) {
  StageSchedule schedule;
  schedule.in_place = in_place;
  return SetSchedule(schedule);
}

absl::Status TieredKvStore::SetSchedule(const StageSchedule& schedule) {
  if (schedule.empty()) {
    RETURN_IF_ERROR(backend_->FollowSchedule(schedule, pages_));
    in_place_.clear();
    return absl::OkStatus();
  }
  // Missing lists are empty lists; present ones are one per group.
  const uint32_t groups = geometry_.layer_groups;
  struct List {
    const char* name;
    const std::vector<std::vector<uint32_t>>& pages;
  };
  const List lists[] = {
      {"resident", schedule.resident}, {"stage", schedule.stage}, {"in_place", schedule.in_place}};
  for (const List& list : lists) {
    if (!list.pages.empty() && list.pages.size() != groups) {
      return absl::InvalidArgumentError(absl::StrCat(list.name, " has ", list.pages.size(),
                                                     " lists, expected layer_groups = ", groups));
    }
  }
  std::vector<std::vector<uint8_t>> listed(groups), mask(groups);
  for (uint32_t g = 0; g < groups; ++g) {
    listed[g].assign(pages_[g].size(), 0);
    mask[g].assign(pages_[g].size(), 0);
  }
  for (const List& list : lists) {
    for (uint32_t g = 0; g < list.pages.size(); ++g) {
      for (uint32_t page : list.pages[g]) {
        if (page >= pages_[g].size()) {
          return absl::InvalidArgumentError(absl::StrCat(list.name, " group ", g, " page ", page,
                                                         " does not exist (", pages_[g].size(),
                                                         " pages)"));
        }
        const Tier t = pages_[g][page].tier;
        if (t != Tier::kT1 && t != Tier::kT2) {
          return absl::InvalidArgumentError(
              absl::StrCat(list.name, " group ", g, " page ", page, " is in ",
                           std::string(tiering::TierName(t)), ", not in host memory (T1/T2)"));
        }
        if (listed[g][page] != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(list.name, " group ", g, " page ", page, " is listed twice"));
        }
        listed[g][page] = 1;
        if (&list.pages == &schedule.in_place) mask[g][page] = 1;
      }
    }
  }
  RETURN_IF_ERROR(backend_->FollowSchedule(schedule, pages_));
  in_place_ = std::move(mask);
  return absl::OkStatus();
}

uint64_t TieredKvStore::in_place_pages() const {
  uint64_t n = 0;
  for (const auto& group : in_place_) {
    for (uint8_t m : group) n += m;
  }
  return n;
}

bool TieredKvStore::InPlaceNow(uint32_t group, uint32_t page) const {
  if (in_place_.empty() || page >= in_place_[group].size() || in_place_[group][page] == 0) {
    return false;
  }
  return AttendedInPlace(pages_[group][page], in_place_[group][page]);
}

bool TieredKvStore::SplitsAt(uint32_t group, uint32_t length) const {
  const uint64_t pages = geometry_.NumPages(length);
  for (uint32_t page = 0; page < pages; ++page) {
    if (InPlaceNow(group, page)) return true;
  }
  return false;
}

}  // namespace kvtier::worker
