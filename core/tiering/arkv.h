#ifndef KVTIER_CORE_TIERING_ARKV_H_
#define KVTIER_CORE_TIERING_ARKV_H_

// ARKV (Lei & Ilager, 2026): tri-state KV cache — Original (T0), Quantized (T2), Evicted (T3) —
// with a per-layer share of full precision chosen at prefill. Runs in the worker: it needs
// per-layer prefill attention statistics. Pure; thread-compatible.
//
// Follows the reference implementation (arkv/calculator.py):
//   prefill, per layer, over the last `observation_window` = 32 prompt queries:
//     entropy  E = −Σ_{head, query, key} p·log(p + 1e−10)
//     variance V = Σ_{head, key} var_query(p)                 (unbiased, as torch.var)
//     kurtosis K = Σ_{head, key} m4 / max(m2, 1e−8)²          (Pearson, population moments)
//     OQ_l = E^(1/τ1) · V^(1/τ2) · K^(1/τ3), τ = (7.7744, 5.4070, 5.5277);
//     full-precision share ratio_l = OQ_l / max_l OQ_l.
//   token score: mean + γ·variance over the observation queries (γ = 263.81) at prefill, the
//     current step's attention (one query: mean only) at decode; the last 32 positions are
//     left out and always kept in full precision; width-5 average smoothing (zero padding,
//     divisor 5, as avg_pool1d); the kv head's score is the mean over its query heads.
//   tri-state per layer: of the live candidates after eviction, the top ratio_l stay Original
//     (T0), the rest are Quantized (T2).
// kvtier's budgets replace ARKV's fixed cache size: the evicted set is floor(r × eligible) as in
// DESIGN.md §2 (r = TieringConfig::budgets.evict_ratio), so ARKV compares with hierarchy at
// equal eviction.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/config.h"
#include "core/tiering/policy.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

struct ArkvConfig {
  double tau_entropy = 7.7744;
  double tau_variance = 5.4070;
  double tau_kurtosis = 5.5277;
  double gamma = 263.81;             // weight of the variance in the heavy-hitter score
  uint32_t observation_window = 32;  // prefill queries the statistics use
  uint32_t smoothing_width = 5;      // odd
  uint32_t recent_tokens = 32;       // always Original

  // INVALID_ARGUMENT naming the field: non-positive τ, negative γ, even smoothing width.
  absl::Status Validate() const;
};

struct ArkvLayerStats {
  double entropy = 0;
  double variance = 0;
  double kurtosis = 0;
};

// One layer's statistics from attention[num_heads][queries][length] (softmax rows of the last
// `queries` prefill queries). INVALID_ARGUMENT for a wrong size, zero counts or non-finite input.
absl::StatusOr<ArkvLayerStats> ArkvPrefillStats(absl::Span<const float> attention,
                                                uint32_t num_heads, uint32_t queries,
                                                uint64_t length);

// ratio_l = OQ_l / max OQ, in [0, 1], one per layer (all 1 when every OQ is 0).
// INVALID_ARGUMENT for an empty list, or negative or non-finite statistics (naming the layer).
absl::StatusOr<std::vector<double>> ArkvOqRatios(absl::Span<const ArkvLayerStats> stats,
                                                 const ArkvConfig& config);

// One layer's heavy-hitter scores, [num_kv_heads][length] row-major, from
// attention[num_q_heads][queries][length]; the last recent_tokens positions score 0 (they are
// protected, not ranked). INVALID_ARGUMENT for wrong sizes or non-finite input.
absl::StatusOr<std::vector<float>> ArkvHeavyHitterScores(absl::Span<const float> attention,
                                                         uint32_t num_q_heads,
                                                         uint32_t num_kv_heads, uint32_t queries,
                                                         uint64_t length, const ArkvConfig& config);

// One layer's page scores from its heavy-hitter scores ([num_kv_heads][length]): the mean over
// kv heads, aggregated per page (sum or max). INVALID_ARGUMENT for a wrong size or page_tokens 0.
absl::StatusOr<std::vector<float>> ArkvLayerPageScores(absl::Span<const float> head_scores,
                                                       uint32_t num_kv_heads, uint64_t length,
                                                       uint32_t page_tokens, PageScoreMode mode);

struct ArkvInput {
  SequenceState sequence;
  // One group per layer (num_groups = num_layers); may lag the sequence like DecisionInput.
  const Placement& current;
  // [layer][page] scores, e.g. AggregatePages of the mean over kv heads of
  // ArkvHeavyHitterScores.
  absl::Span<const float> page_scores;
  absl::Span<const double> oq_ratios;  // one per layer, from ArkvOqRatios
};

// Per-layer tri-state placement. Protected: the prompt (if config.protect_prompt), the first
// config.sink_tokens generated tokens and the last arkv.recent_tokens positions.
// INVALID_ARGUMENT like Policy::DecideDetailed, or for oq_ratios of the wrong count or outside
// [0, 1].
absl::StatusOr<Decision> ArkvDecide(const ArkvInput& input, const TieringConfig& config,
                                    const ArkvConfig& arkv);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_ARKV_H_
