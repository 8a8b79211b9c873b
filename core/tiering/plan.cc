#include "core/tiering/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"

namespace kvtier::tiering {
namespace {

absl::Status CheckShape(const Placement& p, absl::string_view name) {
  if (p.tiers.size() == uint64_t{p.num_groups} * p.num_pages) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      name, ".tiers has ", p.tiers.size(),
      " entries, expected num_groups × num_pages = ", uint64_t{p.num_groups} * p.num_pages));
}

Tier TierAt(const Placement& p, uint32_t group, uint32_t page) {
  return page < p.num_pages ? p.at(group, page) : Tier::kT0;
}

// Execution phase of a move; lower runs first.
int Phase(MoveKind kind) {
  switch (kind) {
    case MoveKind::kEvict:
      return 0;
    case MoveKind::kOffload:
      return 1;
    case MoveKind::kCompress:
      return 2;
    case MoveKind::kDecompress:
      return 3;
    case MoveKind::kPromote:
      return 4;
  }
  return 5;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const Placement& current, const Placement& target) {
  RETURN_IF_ERROR(CheckShape(current, "current"));
  RETURN_IF_ERROR(CheckShape(target, "target"));
  if (current.num_groups != target.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("current.num_groups (", current.num_groups,
                                                   ") differs from target.num_groups (",
                                                   target.num_groups, ")"));
  }
  if (current.num_pages > target.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat("current.num_pages (", current.num_pages,
                                                   ") exceeds target.num_pages (", target.num_pages,
                                                   ")"));
  }
  std::array<std::vector<Move>, 5> phases;
  for (uint32_t g = 0; g < target.num_groups; ++g) {
    for (uint32_t p = 0; p < target.num_pages; ++p) {
      const Tier from = TierAt(current, g, p);
      const Tier to = target.at(g, p);
      if (from == to) continue;
      if (from == Tier::kT3) {
        return absl::InvalidArgumentError(
            absl::StrCat("target places evicted page ", p, " of group ", g, " in ",
                         std::string(TierName(to)), "; an evicted page never comes back"));
      }
      const MoveKind kind = KindOf(from, to);
      phases[Phase(kind)].push_back(
          Move{.group = g, .page = p, .from = from, .to = to, .lossy = from == Tier::kT2});
    }
  }
  Plan plan;
  for (const auto& phase : phases) {
    for (const Move& m : phase) {
      plan.moves.push_back(m);
      ++plan.moves_per_kind[static_cast<int>(KindOf(m.from, m.to))];
    }
  }
  return plan;
}

absl::StatusOr<Placement> WithoutNewOffloads(const Placement& current, const Placement& target) {
  RETURN_IF_ERROR(MakePlan(current, target).status());
  Placement out = target;
  for (uint32_t g = 0; g < out.num_groups; ++g) {
    for (uint32_t p = 0; p < out.num_pages; ++p) {
      const Tier to = out.at(g, p);
      if (to == Tier::kT1 || to == Tier::kT2) out.at(g, p) = TierAt(current, g, p);
    }
  }
  return out;
}

absl::StatusOr<Placement> ApplyPlan(const Placement& current, const Plan& plan,
                                    uint32_t num_pages) {
  RETURN_IF_ERROR(CheckShape(current, "current"));
  if (num_pages < current.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_pages (", num_pages, ") is below current.num_pages (", current.num_pages, ")"));
  }
  Placement out{.num_groups = current.num_groups, .num_pages = num_pages, .tiers = {}};
  out.tiers.assign(uint64_t{out.num_groups} * num_pages, Tier::kT0);
  for (uint32_t g = 0; g < current.num_groups; ++g) {
    for (uint32_t p = 0; p < current.num_pages; ++p) out.at(g, p) = current.at(g, p);
  }
  for (size_t i = 0; i < plan.moves.size(); ++i) {
    const Move& m = plan.moves[i];
    if (m.group >= out.num_groups || m.page >= out.num_pages) {
      return absl::InvalidArgumentError(absl::StrCat("plan.moves[", i, "] names group ", m.group,
                                                     " page ", m.page, ", out of range"));
    }
    if (out.at(m.group, m.page) != m.from) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan.moves[", i, "] moves page ", m.page, " of group ", m.group, " from ",
                       std::string(TierName(m.from)), " but it is in ",
                       std::string(TierName(out.at(m.group, m.page)))));
    }
    out.at(m.group, m.page) = m.to;
  }
  return out;
}

absl::StatusOr<PlacementReport> Report(const Placement& placement, const SequenceState& seq,
                                       const layout::KvGeometry& geometry) {
  RETURN_IF_ERROR(geometry.Validate());
  RETURN_IF_ERROR(CheckShape(placement, "placement"));
  if (geometry.layer_groups != placement.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.layer_groups (", geometry.layer_groups,
                                                   ") differs from placement.num_groups (",
                                                   placement.num_groups, ")"));
  }
  if (placement.num_pages != geometry.NumPages(seq.length)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.num_pages (", placement.num_pages, ") differs from the ",
                     geometry.NumPages(seq.length), " pages of a ", seq.length, "-token sequence"));
  }
  if (seq.prompt_tokens > seq.length) {
    return absl::InvalidArgumentError(absl::StrCat("sequence.prompt_tokens (", seq.prompt_tokens,
                                                   ") exceeds sequence.length (", seq.length, ")"));
  }
  PlacementReport r;
  r.generated_tokens = seq.length - seq.prompt_tokens;
  r.group_tokens.resize(placement.num_groups);
  double evicted_layer_tokens = 0;
  for (uint32_t g = 0; g < placement.num_groups; ++g) {
    uint64_t evicted_generated = 0;
    for (uint32_t p = 0; p < placement.num_pages; ++p) {
      const uint64_t begin = geometry.PageBegin(p);
      const uint64_t end = std::min<uint64_t>(seq.length, begin + geometry.page_tokens);
      const int t = static_cast<int>(placement.at(g, p));
      r.group_tokens[g][t] += end - begin;
      r.tokens[t] += end - begin;
      if (t == 0) r.t0_bytes += geometry.PageBytes(g);
      if (t == 1) r.t1_bytes += geometry.PageBytes(g);
      if (t == 3 && end > seq.prompt_tokens) {
        evicted_generated += end - std::max(begin, seq.prompt_tokens);
      }
    }
    evicted_layer_tokens += static_cast<double>(evicted_generated) * geometry.LayersInGroup(g);
  }
  if (r.generated_tokens > 0) {
    r.evicted_generated_fraction =
        evicted_layer_tokens / (static_cast<double>(r.generated_tokens) * geometry.num_layers);
  }
  return r;
}

absl::StatusOr<std::array<uint64_t, 5>> PlanBytes(const Plan& plan,
                                                  const layout::KvGeometry& geometry) {
  RETURN_IF_ERROR(geometry.Validate());
  std::array<uint64_t, 5> bytes{};
  for (size_t i = 0; i < plan.moves.size(); ++i) {
    const Move& m = plan.moves[i];
    if (m.group >= geometry.layer_groups) {
      return absl::InvalidArgumentError(absl::StrCat("plan.moves[", i, "].group (", m.group,
                                                     ") is not below geometry.layer_groups (",
                                                     geometry.layer_groups, ")"));
    }
    bytes[static_cast<int>(KindOf(m.from, m.to))] += geometry.PageBytes(m.group);
  }
  return bytes;
}

}  // namespace kvtier::tiering
