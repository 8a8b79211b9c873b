#ifndef KVTIER_CORE_TIERING_SCORES_H_
#define KVTIER_CORE_TIERING_SCORES_H_

// Cumulative attention scores (DESIGN.md §2, "Score"). The worker feeds every decode step's
// attention; the snapshot carries PageScores. Thread-compatible: one owner per sequence.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/tiering/config.h"
#include "core/tiering/selection.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

// Shape of one step's attention handed to the accumulator.
enum class AttentionLayout : uint8_t {
  // [num_layers][num_heads][length], row-major: the softmax row of each query head.
  kPerHead = 0,
  // [num_layers][length]: already summed over the query heads (divided by num_heads here).
  kHeadSummed = 1,
};

// Per sequence, per layer group, per position cumulative score. At each step, position i of
// group g gains the mean over g's layers of (1/H) Σ_heads α[layer][head][i], the mean taken over
// the layers whose head-mean is finite (none finite: no gain). Layer groups split layers like
// layout::KvGeometry: group g = layers [g·L/G, (g+1)·L/G). Frozen positions (evicted) keep their
// score. Positions appear as the sequence grows; new ones start at 0.
class ScoreAccumulator {
 public:
  // INVALID_ARGUMENT naming the field when a count is 0 or layer_groups > num_layers.
  static absl::StatusOr<ScoreAccumulator> Create(uint32_t num_layers, uint32_t num_heads,
                                                 uint32_t layer_groups = 1);

  // Adds one decode step. `length` = cached positions the query attended (the sequence may
  // only grow). INVALID_ARGUMENT naming `attention` when its size does not match
  // the layout × length, or naming `length` when it shrinks; nothing changes then.
  absl::Status AddStep(absl::Span<const float> attention, uint64_t length,
                       AttentionLayout layout = AttentionLayout::kPerHead);

  // Seeds scores from prefill attention column sums (Σ over prompt queries of α[q][i]), same
  // shapes and rule as AddStep with length = prompt length.
  absl::Status SeedPrefill(absl::Span<const float> column_sums, uint64_t length,
                           AttentionLayout layout = AttentionLayout::kPerHead);

  // Adds scores a device accumulated itself (AccumulateDeviceMass, read once per re-tiering):
  // gained[i] to position i of group g, except frozen positions and non-finite values; the
  // sequence grows to gained.size(). INVALID_ARGUMENT naming the field for a group out of range
  // or a shrinking length; nothing changes then.
  absl::Status AddScores(uint32_t group, absl::Span<const float> gained);

  // Freezes positions (evicted): their scores never change again. Clipped to length().
  // INVALID_ARGUMENT for a group out of range.
  absl::Status Freeze(uint32_t group, Range positions);
  // Freezes every position of every T3 page. INVALID_ARGUMENT when placement.num_groups differs
  // from layer_groups() or page_tokens is 0.
  absl::Status FreezeEvicted(const Placement& placement, uint32_t page_tokens);
  // Forgets every position at or after `length` (a rollback: speculative decoding, a crop);
  // the positions kept keep their scores and frozen flags. INVALID_ARGUMENT when `length`
  // exceeds length().
  absl::Status Truncate(uint64_t length);

  uint32_t num_layers() const { return num_layers_; }
  uint32_t num_heads() const { return num_heads_; }
  uint32_t layer_groups() const { return layer_groups_; }
  uint64_t length() const { return length_; }

  // Per-position scores of group g, [0, length()). REQUIRES: g < layer_groups().
  absl::Span<const float> TokenScores(uint32_t g) const;
  bool IsFrozen(uint32_t g, uint64_t position) const;

  // One score per page of group g: sum (or max) over the page's written positions.
  // INVALID_ARGUMENT for g out of range or page_tokens 0.
  absl::StatusOr<std::vector<float>> PageScores(uint32_t g, uint32_t page_tokens,
                                                PageScoreMode mode = PageScoreMode::kSum) const;
  // PageScores with the config's page_tokens and page_score mode.
  absl::StatusOr<std::vector<float>> PageScores(uint32_t g, const TieringConfig& config) const {
    return PageScores(g, config.page_tokens, config.page_score);
  }
  // Every group's page scores, group-major: what DecisionInput::page_scores takes.
  absl::StatusOr<std::vector<float>> AllPageScores(uint32_t page_tokens,
                                                   PageScoreMode mode = PageScoreMode::kSum) const;

 private:
  ScoreAccumulator(uint32_t num_layers, uint32_t num_heads, uint32_t layer_groups);
  absl::Status Add(absl::Span<const float> attention, uint64_t length, AttentionLayout layout,
                   absl::string_view field);
  uint32_t GroupBegin(uint32_t g) const { return g * num_layers_ / layer_groups_; }

  uint32_t num_layers_;
  uint32_t num_heads_;
  uint32_t layer_groups_;
  uint64_t length_ = 0;
  std::vector<std::vector<float>> scores_;    // [group][position]
  std::vector<std::vector<uint8_t>> frozen_;  // [group][position]
  // Per-step scratch, kept to avoid reallocation: Σ finite layer means and their count.
  std::vector<double> step_sum_;
  std::vector<uint32_t> step_count_;
};

// The device backend's score rule, as its kernel runs it (this is the CPU reference): one
// layer's attention, summed over query heads (and over queries for a prefill), adds
// mass[i] * weight to acc[i] in f32, with weight = 1 / (num_heads × layers of the group) — the
// paper's mean over heads and over layers, accumulated layer by layer and step by step instead
// of per step. Equal to ScoreAccumulator::AddStep up to f32 rounding when every layer's mass is
// finite (the device does not skip non-finite layers; the kernel's softmax gives none).
void AccumulateDeviceMass(absl::Span<const float> mass, float weight, absl::Span<float> acc);
inline float DeviceMassWeight(uint32_t num_heads, uint32_t layers_in_group) {
  return 1.0f / (static_cast<float>(num_heads) * static_cast<float>(layers_in_group));
}

// Page scores from token scores: sum (or max) over each page's tokens; the last page may be
// partial. Exposed for the evaluation and the tests.
std::vector<float> AggregatePages(absl::Span<const float> token_scores, uint32_t page_tokens,
                                  PageScoreMode mode);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_SCORES_H_
