// TieredKvStore: the pages a prefetch schedule leaves in host memory (attended there by the
// backend as a second partial: split attention).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

using tiering::Tier;

absl::Status TieredKvStore::SetInPlacePages(const std::vector<std::vector<uint32_t>>& in_place) {
  if (in_place.empty()) {
    in_place_.clear();
    return absl::OkStatus();
  }
  if (in_place.size() != geometry_.layer_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("in_place has ", in_place.size(),
                     " lists, expected layer_groups = ", geometry_.layer_groups));
  }
  std::vector<std::vector<uint8_t>> mask(geometry_.layer_groups);
  for (uint32_t g = 0; g < geometry_.layer_groups; ++g) {
    mask[g].assign(pages_[g].size(), 0);
    for (uint32_t page : in_place[g]) {
      if (page >= pages_[g].size()) {
        return absl::InvalidArgumentError(absl::StrCat("in_place group ", g, " page ", page,
                                                       " does not exist (", pages_[g].size(),
                                                       " pages)"));
      }
      const Tier t = pages_[g][page].tier;
      if (t != Tier::kT1 && t != Tier::kT2) {
        return absl::InvalidArgumentError(absl::StrCat("in_place group ", g, " page ", page,
                                                       " is in ", std::string(tiering::TierName(t)),
                                                       ", not in host memory (T1/T2)"));
      }
      if (mask[g][page] != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("in_place group ", g, " page ", page, " is listed twice"));
      }
      mask[g][page] = 1;
    }
  }
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
