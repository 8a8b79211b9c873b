#ifndef KVTIER_CORE_TIERING_PLAN_H_
#define KVTIER_CORE_TIERING_PLAN_H_

// Plan diffs (current placement → target placement) and placement reports. Pure functions;
// thread-compatible.

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layout/geometry.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

// The ordered moves that turn one placement into another. Order (each phase sorted by group,
// then page): evictions (→T3, free every tier first), offloads (T0→T1), compressions (→T2),
// decompressions (T2→T1), promotions (→T0). Every demotion precedes every promotion, so T0
// never holds more pages mid-plan than at its start or end. A move out of T2 is `lossy`.
struct Plan {
  std::vector<Move> moves;
  std::array<uint64_t, 5> moves_per_kind{};  // indexed by MoveKind

  uint64_t Count(MoveKind kind) const { return moves_per_kind[static_cast<int>(kind)]; }
};

// INVALID_ARGUMENT when num_groups differ, a tiers vector does not match its shape,
// current has more pages than target, or a page evicted in current is live in target (an
// evicted page never comes back). Pages beyond current.num_pages are taken to be in T0.
absl::StatusOr<Plan> MakePlan(const Placement& current, const Placement& target);

// Applies `plan` to `current` (extended with T0 pages to `num_pages` if it has fewer).
// INVALID_ARGUMENT when a move's `from` is not the page's tier or it names a page out of range.
absl::StatusOr<Placement> ApplyPlan(const Placement& current, const Plan& plan, uint32_t num_pages);

// Tokens and bytes of one placement. Token counts add over groups (a token counted once per
// group); with one group they are tokens.
struct PlacementReport {
  std::array<uint64_t, kNumTiers> tokens{};                   // summed over groups
  std::vector<std::array<uint64_t, kNumTiers>> group_tokens;  // [group][tier]
  uint64_t generated_tokens = 0;                              // length − prompt
  // Cumulative evicted fraction of generated tokens, layer-weighted over groups:
  // Σ_g layers(g) × evicted generated tokens(g) / (num_layers × generated). 0 if none.
  double evicted_generated_fraction = 0;
  uint64_t t0_bytes = 0;  // Σ_g T0 pages(g) × PageBytes(g): whole pages, as allocated
  uint64_t t1_bytes = 0;  // same for T1 (full precision)
};

// INVALID_ARGUMENT when geometry is invalid, geometry.layer_groups != placement.num_groups,
// or placement.num_pages != geometry.NumPages(seq.length).
absl::StatusOr<PlacementReport> Report(const Placement& placement, const SequenceState& seq,
                                       const layout::KvGeometry& geometry);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_PLAN_H_
