#ifndef KVTIER_CORE_TIERING_H2O_H_
#define KVTIER_CORE_TIERING_H2O_H_

// H2O, Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023), faithful: per layer and per head, keep
// the most recent tokens plus the tokens with the largest *cumulative* attention (the sum over
// every decode step so far, not one step's attention), and evict the rest for good. Runs in
// the worker: it needs per-(layer, kv head) attention. Pure; thread-compatible.
//
// Published defaults (the H2O reference, h2o_hf): heavy_ratio = recent_ratio = 0.1 of the
// current sequence length (20% KV cache, split evenly between heavy hitters and the recent
// window). With GQA a kv head's score is the mean over its query heads (H2O was MHA; the worker
// can only drop a position per kv head).

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/keep_mask.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

// Cumulative attention per (layer, kv head, position). Thread-compatible.
class HeadScoreAccumulator {
 public:
  // INVALID_ARGUMENT unless every count is positive and num_q_heads % num_kv_heads == 0.
  static absl::StatusOr<HeadScoreAccumulator> Create(uint32_t num_layers, uint32_t num_q_heads,
                                                     uint32_t num_kv_heads);

  // One decode step: attention[layer][q_head][position], length positions (softmax rows).
  // kv head h gains, at each position, the mean over its query heads
  // [h·G, (h+1)·G), G = num_q_heads / num_kv_heads; non-finite values add nothing.
  // INVALID_ARGUMENT for a wrong size or a shrinking length; nothing changes then.
  absl::Status AddStep(absl::Span<const float> attention, uint64_t length);
  // Prefill: column sums of the prefill attention, same shape and rule.
  absl::Status SeedPrefill(absl::Span<const float> column_sums, uint64_t length);

  uint32_t num_layers() const { return num_layers_; }
  uint32_t num_q_heads() const { return num_q_heads_; }
  uint32_t num_kv_heads() const { return num_kv_heads_; }
  uint64_t length() const { return length_; }
  // Scores of (layer, kv_head) over [0, length()). REQUIRES: indices in range.
  absl::Span<const float> Scores(uint32_t layer, uint32_t kv_head) const;

 private:
  HeadScoreAccumulator(uint32_t num_layers, uint32_t num_q_heads, uint32_t num_kv_heads);
  absl::Status Add(absl::Span<const float> attention, uint64_t length, const char* field);

  uint32_t num_layers_, num_q_heads_, num_kv_heads_;
  uint64_t length_ = 0;
  std::vector<std::vector<float>> scores_;  // [layer * num_kv_heads + kv_head][position]
};

struct H2oConfig {
  double heavy_ratio = 0.1;               // heavy hitters kept: floor(heavy_ratio × length)
  double recent_ratio = 0.1;              // recent window: floor(recent_ratio × length)
  std::optional<uint64_t> heavy_tokens;   // absolute count instead of heavy_ratio
  std::optional<uint64_t> recent_tokens;  // absolute count instead of recent_ratio
  bool protect_prompt = false;            // H2O itself does not protect the prompt

  // INVALID_ARGUMENT naming the field for a ratio outside [0, 1].
  absl::Status Validate() const;
};

// The keep mask after one H2O eviction round, per (layer, kv head): the recent window
// [length − recent, length) and (if protect_prompt) the prompt stay; among the other positions
// still kept, all but the `heavy` with the largest cumulative score (ties: the later position
// wins) are evicted. Positions evicted in `current` stay evicted; positions beyond
// current.length are new and kept. Calling it every decode step is H2O's greedy eviction;
// calling it every Δ steps evicts the same count at once.
// INVALID_ARGUMENT when shapes disagree (scores vs current: layers, kv heads; current.length >
// seq.length; scores.length() != seq.length) or the config is invalid.
absl::StatusOr<KeepMask> H2oSelect(const HeadScoreAccumulator& scores, const KeepMask& current,
                                   const SequenceState& seq, const H2oConfig& config);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_H2O_H_
