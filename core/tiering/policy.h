#ifndef KVTIER_CORE_TIERING_POLICY_H_
#define KVTIER_CORE_TIERING_POLICY_H_

// Policies behind one interface. The daemon runs them for every snapshot, the worker runs them
// locally when the daemon is unreachable, the evaluation runs every policy through them.
//
//   name        where        decides from
//   full        anywhere     nothing: every page T0 (no eviction, no offload)
//   hierarchy   anywhere     page scores + placement (DESIGN.md §2)
//   streaming   anywhere     positions only: attention sinks + recent window (StreamingLLM)
//   h2o         worker only  per-(layer, kv head) cumulative scores: core/tiering/h2o.h
//   rkv         worker only  attention of the last α queries + key vectors: core/tiering/rkv.h
//   arkv        worker only  per-layer prefill statistics + per-layer scores: core/tiering/arkv.h
//
// Worker-only policies report NeedsWorkerState() and refuse Decide() with FAILED_PRECONDITION:
// a daemon snapshot does not carry what they need, and guessing would silently change them.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/config.h"
#include "core/tiering/selection.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

// What a snapshot carries for one sequence.
struct DecisionInput {
  SequenceState sequence;
  // Current tiers, group-major. num_groups >= 1; num_pages may lag the sequence (pages written
  // since the last snapshot are in T0) but never exceed ceil(length / page_tokens).
  const Placement& current;
  // One finite score per (group, page), group-major: num_groups × ceil(length / page_tokens).
  absl::Span<const float> page_scores;
};

// A target placement and what each group's selection decided (budgets, overflow).
struct Decision {
  Placement placement;
  std::vector<GroupStats> groups;
  // Largest protected overflow over the T0 budget across groups, in tokens (0 = none).
  uint64_t protected_overflow_tokens = 0;
};

// A tiering policy. Immutable after construction: Decide is const and thread-safe.
class Policy {
 public:
  virtual ~Policy() = default;

  virtual std::string_view Name() const = 0;
  // True for policies that need per-head attention, keys or per-layer statistics that only
  // the worker holds (h2o, rkv, arkv); Decide then fails with FAILED_PRECONDITION.
  virtual bool NeedsWorkerState() const = 0;
  // The target placement and its statistics. INVALID_ARGUMENT naming the field and value for
  // wrong lengths, non-finite scores or a placement contradicting the evicted set (an evicted
  // protected page, more evicted pages than the budget allows). Pure: nothing is changed.
  virtual absl::StatusOr<Decision> DecideDetailed(const DecisionInput& input) const = 0;

  // DecideDetailed's placement.
  absl::StatusOr<Placement> Decide(const DecisionInput& input) const;

  const TieringConfig& config() const { return config_; }

 protected:
  explicit Policy(const TieringConfig& config) : config_(config) {}

 private:
  TieringConfig config_;
};

// Checks `current` against the sequence (groups ≥ 1, tiers sized groups × pages, no more pages
// than ceil(length / page_tokens), prompt ≤ length) and returns an all-T0 target of the
// sequence's full page count. Shared by the policies; INVALID_ARGUMENT naming the field.
absl::StatusOr<Placement> TargetShape(const SequenceState& sequence, const Placement& current,
                                      uint32_t page_tokens);

// Names MakePolicy accepts.
inline constexpr std::string_view kPolicyNames[] = {"full", "hierarchy", "arkv",
                                                    "h2o",  "streaming", "rkv"};

// INVALID_ARGUMENT for an unknown name or an invalid config (config.Validate()).
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name,
                                                   const TieringConfig& config);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_POLICY_H_
