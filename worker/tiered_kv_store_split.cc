// TieredKvStore: split attention over the pages a prefetch schedule leaves in host memory.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/kernels/attention_merge.h"
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
  const Tier t = pages_[group][page].tier;
  return t == Tier::kT1 || t == Tier::kT2;
}

bool TieredKvStore::SplitsAt(uint32_t group, uint32_t length) const {
  const uint64_t pages = geometry_.NumPages(length);
  for (uint32_t page = 0; page < pages; ++page) {
    if (InPlaceNow(group, page)) return true;
  }
  return false;
}

void TieredKvStore::AttendSplit(const kernels::AttentionParams& p, uint32_t group) {
  // Part 0: every page but those in place (what the device would attend); part 1: those in
  // place (the CPU's partial over DDR). Each sees the whole length, the other's rows null.
  const uint32_t pt = geometry_.page_tokens;
  for (int part = 0; part < 2; ++part) {
    split_k_[part].assign(p.k_rows, p.k_rows + p.length);
    split_v_[part].assign(p.v_rows, p.v_rows + p.length);
  }
  for (uint32_t page = 0; page * uint64_t{pt} < p.length; ++page) {
    const int other = InPlaceNow(group, page) ? 0 : 1;  // the part that does not read this page
    const uint32_t end = std::min<uint32_t>(p.length, (page + 1) * pt);
    for (uint32_t pos = page * pt; pos < end; ++pos)
      split_k_[other][pos] = split_v_[other][pos] = nullptr;
  }
  const size_t out_floats = size_t{p.num_q_heads} * p.head_dim;
  kernels::AttentionPartial parts[2];
  for (int part = 0; part < 2; ++part) {
    part_out_[part].resize(out_floats);
    part_lse_[part].resize(p.num_q_heads);
    part_mass_[part].resize(size_t{p.num_q_heads} * p.length);
    kernels::AttentionParams q = p;
    q.out = part_out_[part].data();
    q.position_mass = nullptr;
    q.lse = part_lse_[part].data();
    q.head_mass = part_mass_[part].data();
    q.k_rows = split_k_[part].data();
    q.v_rows = split_v_[part].data();
    kernels::Attention(q, isa_);
    parts[part] = {part_out_[part].data(), part_lse_[part].data(), part_mass_[part].data()};
  }
  kernels::MergeAttentionPartials(parts, {1, p.num_q_heads, p.head_dim, p.length}, p.out,
                                  /*lse=*/nullptr, p.position_mass);
  ++stats_.split_attends;
}

}  // namespace kvtier::worker
