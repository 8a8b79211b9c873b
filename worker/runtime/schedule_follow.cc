#include "worker/runtime/schedule_follow.h"

#include "absl/strings/str_cat.h"

namespace kvtier::worker {
namespace {

using tiering::Tier;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("schedule: ", what));
}

}  // namespace

absl::StatusOr<FollowedSchedule> CheckSchedule(const v1::PrefetchSchedule& schedule,
                                               const TieredKvStore& store) {
  const tiering::Placement placement = store.placement();
  if (static_cast<uint32_t>(schedule.groups_size()) != placement.num_groups) {
    return Invalid(absl::StrCat("groups has ", schedule.groups_size(),
                                " entries, expected layer_groups = ", placement.num_groups));
  }
  FollowedSchedule out;
  out.pages.resident.resize(placement.num_groups);
  out.pages.stage.resize(placement.num_groups);
  out.pages.in_place.resize(placement.num_groups);
  out.pages.staging_bytes = schedule.staging_bytes();
  out.pages.h2d_bytes_per_step = schedule.h2d_bytes_per_step();
  std::vector<uint8_t> listed(placement.tiers.size(), 0);
  for (uint32_t g = 0; g < placement.num_groups; ++g) {
    const v1::GroupSchedule& gs = schedule.groups(static_cast<int>(g));
    struct List {
      const char* name;
      const google::protobuf::RepeatedField<uint32_t>& pages;
      uint64_t* bytes;
      std::vector<uint32_t>* keep;  // where the list's pages go
    };
    const List lists[] = {{"resident", gs.resident(), &out.resident_bytes, &out.pages.resident[g]},
                          {"stage", gs.stage(), &out.stage_bytes, &out.pages.stage[g]},
                          {"in_place", gs.in_place(), &out.in_place_bytes, &out.pages.in_place[g]}};
    for (const List& list : lists) {
      for (uint32_t page : list.pages) {
        const std::string where = absl::StrCat("groups[", g, "].", list.name, " page ", page);
        if (page >= placement.num_pages) {
          return Invalid(absl::StrCat(where, " does not exist (", placement.num_pages, " pages)"));
        }
        const Tier t = placement.at(g, page);
        if (t != Tier::kT1 && t != Tier::kT2) {
          return Invalid(absl::StrCat(where, " is in ", std::string(tiering::TierName(t)),
                                      ": a schedule names T1/T2 pages only"));
        }
        uint8_t& seen = listed[size_t{g} * placement.num_pages + page];
        if (seen != 0) return Invalid(absl::StrCat(where, " is listed twice"));
        seen = 1;
        *list.bytes += store.SlotBytes(t == Tier::kT1 ? PoolKind::kDdr : PoolKind::kCompressed, g);
        list.keep->push_back(page);
      }
    }
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    const Tier t = placement.tiers[i];
    if (listed[i] == 0 && (t == Tier::kT1 || t == Tier::kT2)) {
      return Invalid(absl::StrCat("group ", i / placement.num_pages, " page ",
                                  i % placement.num_pages, " is in ",
                                  std::string(tiering::TierName(t)), " but in no list"));
    }
  }
  if (out.resident_bytes > schedule.staging_bytes()) {
    return Invalid(absl::StrCat("resident pages take ", out.resident_bytes,
                                " bytes, over staging_bytes ", schedule.staging_bytes()));
  }
  if (out.stage_bytes > schedule.h2d_bytes_per_step()) {
    return Invalid(absl::StrCat("staged pages take ", out.stage_bytes,
                                " bytes, over h2d_bytes_per_step ", schedule.h2d_bytes_per_step()));
  }
  return out;
}

}  // namespace kvtier::worker
