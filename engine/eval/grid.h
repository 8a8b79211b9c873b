#ifndef KVTIER_ENGINE_EVAL_GRID_H_
#define KVTIER_ENGINE_EVAL_GRID_H_

// The configurations `kvtier-run eval` compares against the full cache: kvtier's hierarchy at
// (β, r, γ, codec), the eviction baselines h2o / streaming / rkv at the HBM footprint β (they
// keep ~β of the tokens per layer and kv head and evict the rest), and arkv at eviction r.

#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::engine {

struct EvalConfig {
  std::string policy;           // hierarchy | h2o | streaming | rkv | arkv
  double hbm_ratio = 1.0;       // β: hierarchy's T0 cap, the baselines' kept share
  double evict_ratio = 0.0;     // r: hierarchy, arkv
  double compress_ratio = 0.0;  // γ: hierarchy
  // ε: hierarchy evicts only while the evicted pages' estimated mass stays <= it (inf: no limit).
  double max_lost_mass = std::numeric_limits<double>::infinity();
  std::string codec = "int8_kivi";

  // A stable, readable key: "hierarchy b0.50 r0.03 g0.00 int8_kivi" (+ " e0.010" for a finite ε).
  std::string Name() const;
};

// INVALID_ARGUMENT naming the field for an unknown policy or codec, or a ratio out of range.
absl::Status ValidateConfig(const EvalConfig& config);

// "paper" (the full grid), "headline" (its subset run for docs/evaluation.md) or
// "quick" (the ctest subset).
// INVALID_ARGUMENT naming --grid for anything else.
absl::StatusOr<std::vector<EvalConfig>> MakeGrid(const std::string& name);

// Parses "policy:key=value,key=value" (keys: hbm, evict, compress, lost (ε), codec), e.g.
// "h2o:hbm=0.5" or "hierarchy:hbm=0.3,evict=0.1". INVALID_ARGUMENT naming the spec.
absl::StatusOr<EvalConfig> ParseConfig(const std::string& spec);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_GRID_H_
