#ifndef KVTIER_CORE_TIERING_CONFIG_H_
#define KVTIER_CORE_TIERING_CONFIG_H_

// Tiering configuration: page size, the protected set, the re-tiering interval and the three
// explicit budgets of DESIGN.md §2. Plain values; thread-compatible.

#include <cstdint>
#include <limits>
#include <string_view>

#include "absl/status/status.h"

namespace kvtier::tiering {

// How a page's score is formed from its tokens' cumulative scores.
enum class PageScoreMode : uint8_t {
  kSum = 0,  // DESIGN.md default: sum over the page's written tokens
  kMax = 1,  // the page is as important as its best token
};
inline constexpr PageScoreMode kSum = PageScoreMode::kSum;
inline constexpr PageScoreMode kMax = PageScoreMode::kMax;

std::string_view PageScoreModeName(PageScoreMode mode);

// Explicit, non-compounding budgets. Each applies to the whole sequence after every re-tiering,
// never to "this round":
//   evict_ratio r     evicted set = floor(r × eligible) tokens, rounded down to whole pages;
//   hbm_ratio β       T0 ≤ ceil(β × live tokens) (protected pages win; overflow is reported);
//   compress_ratio γ  floor(γ × live candidate pages) lowest-scoring survivors go to T2;
//   max_lost_mass ε   eviction stops short of r once the evicted pages' estimated attention
//                     mass per decode step (core/tiering/lost_mass.h) would exceed ε: those
//                     pages stay live (T1/T2) instead. +inf: r alone decides; 0: no eviction.
// REQUIRES (Validate): every ratio in [0, 1], r + γ ≤ 1, ε ≥ 0 (not NaN).
struct Budgets {
  double evict_ratio = 0;
  double hbm_ratio = 1;
  double compress_ratio = 0;
  double max_lost_mass = std::numeric_limits<double>::infinity();

  absl::Status Validate() const;
};

struct TieringConfig {
  uint32_t page_tokens = 16;      // 1 = token-exact (the paper)
  uint32_t sink_tokens = 4;       // first generated tokens, always T0
  uint32_t window_tokens = 128;   // last positions, always T0
  bool protect_prompt = true;     // the prompt [0, P) always T0
  uint32_t retier_interval = 64;  // Δ: decode steps between re-tierings
  PageScoreMode page_score = kSum;
  Budgets budgets;

  // INVALID_ARGUMENT naming the field and its value: page_tokens or retier_interval of 0,
  // a ratio outside [0, 1] or not finite, evict_ratio + compress_ratio > 1.
  absl::Status Validate() const;
};

// True when decode step `step` (0 = prefill end) is a re-tiering step: every Δ steps.
// REQUIRES: config.retier_interval > 0.
inline bool IsRetierStep(const TieringConfig& config, uint64_t step) {
  return step % config.retier_interval == 0;
}

// floor(ratio × n) and ceil(ratio × n), robust to the binary representation of decimal
// ratios (0.29 × 100 is 28.999999999999996 in double; the intent is 29). A product within
// 1e-9 relative of an integer counts as that integer. REQUIRES: 0 <= ratio <= 1.
uint64_t FloorRatio(double ratio, uint64_t n);
uint64_t CeilRatio(double ratio, uint64_t n);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_CONFIG_H_
