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

// The worker's fallback when the daemon is unreachable (DESIGN.md §3): the policy's target with
// every move that needs a new host slot undone — a page the target sends to T1 or T2 from another
// tier keeps its current tier. Evictions and promotions to T0 stay. Errors as MakePlan.
absl::StatusOr<Placement> WithoutNewOffloads(const Placement& current, const Placement& target);

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

// Full-precision bytes a plan moves, per MoveKind (pages × PageBytes(group); evictions move
// nothing but are counted as the bytes they free). INVALID_ARGUMENT for an invalid geometry or a
// move whose group is not below geometry.layer_groups.
absl::StatusOr<std::array<uint64_t, 5>> PlanBytes(const Plan& plan,
                                                  const layout::KvGeometry& geometry);

// Peak and mean of T0 bytes over a run's re-tierings: what every report states besides the
// cumulative evicted fraction. Thread-compatible.
class T0BytesSeries {
 public:
  void Add(uint64_t t0_bytes) {
    peak_ = t0_bytes > peak_ ? t0_bytes : peak_;
    sum_ += static_cast<double>(t0_bytes);
    ++count_;
  }
  uint64_t peak() const { return peak_; }
  double mean() const { return count_ == 0 ? 0.0 : sum_ / static_cast<double>(count_); }
  uint64_t count() const { return count_; }

 private:
  uint64_t peak_ = 0;
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_PLAN_H_
