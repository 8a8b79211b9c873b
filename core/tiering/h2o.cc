#include "core/tiering/h2o.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "core/tiering/config.h"
#include "core/tiering/selection.h"

namespace kvtier::tiering {

HeadScoreAccumulator::HeadScoreAccumulator(uint32_t num_layers, uint32_t num_q_heads,
                                           uint32_t num_kv_heads)
    : num_layers_(num_layers),
      num_q_heads_(num_q_heads),
      num_kv_heads_(num_kv_heads),
      scores_(uint64_t{num_layers} * num_kv_heads) {}

absl::StatusOr<HeadScoreAccumulator> HeadScoreAccumulator::Create(uint32_t num_layers,
                                                                  uint32_t num_q_heads,
                                                                  uint32_t num_kv_heads) {
  if (num_layers == 0 || num_q_heads == 0 || num_kv_heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers, num_q_heads and num_kv_heads must be positive, got ", num_layers,
                     ", ", num_q_heads, ", ", num_kv_heads));
  }
  if (num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_q_heads (", num_q_heads, ") must be a multiple of num_kv_heads (", num_kv_heads, ")"));
  }
  return HeadScoreAccumulator(num_layers, num_q_heads, num_kv_heads);
}

absl::Status HeadScoreAccumulator::AddStep(absl::Span<const float> attention, uint64_t length) {
  return Add(attention, length, "attention");
}

absl::Status HeadScoreAccumulator::SeedPrefill(absl::Span<const float> column_sums,
                                               uint64_t length) {
  return Add(column_sums, length, "column_sums");
}

absl::Status HeadScoreAccumulator::Add(absl::Span<const float> attention, uint64_t length,
                                       const char* field) {
  const uint64_t expected = uint64_t{num_layers_} * num_q_heads_ * length;
  if (attention.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", attention.size(),
                                                   " values, expected num_layers × num_q_heads"
                                                   " × length = ",
                                                   expected));
  }
  if (length < length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("length must not shrink: got ", length, " after ", length_));
  }
  length_ = length;
  const uint32_t group = num_q_heads_ / num_kv_heads_;
  for (uint32_t l = 0; l < num_layers_; ++l) {
    for (uint32_t kv = 0; kv < num_kv_heads_; ++kv) {
      std::vector<float>& s = scores_[uint64_t{l} * num_kv_heads_ + kv];
      s.resize(length, 0.0f);
      for (uint32_t q = kv * group; q < (kv + 1) * group; ++q) {
        const float* row = attention.data() + (uint64_t{l} * num_q_heads_ + q) * length;
        for (uint64_t i = 0; i < length; ++i) {
          if (std::isfinite(row[i])) s[i] += row[i] / static_cast<float>(group);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Span<const float> HeadScoreAccumulator::Scores(uint32_t layer, uint32_t kv_head) const {
  return scores_[uint64_t{layer} * num_kv_heads_ + kv_head];
}

absl::Status H2oConfig::Validate() const {
  for (auto [field, value] :
       {std::pair{"heavy_ratio", heavy_ratio}, std::pair{"recent_ratio", recent_ratio}}) {
    if (!(value >= 0.0 && value <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " must be in [0, 1], got ", value));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KeepMask> H2oSelect(const HeadScoreAccumulator& scores, const KeepMask& current,
                                   const SequenceState& seq, const H2oConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(current.Validate());
  if (current.num_layers != scores.num_layers() || current.num_kv_heads != scores.num_kv_heads()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep mask is ", current.num_layers, " layers × ", current.num_kv_heads,
                     " kv heads, scores are ", scores.num_layers(), " × ", scores.num_kv_heads()));
  }
  if (current.length > seq.length || scores.length() != seq.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence.length (", seq.length, ") must equal the scores' length (",
                     scores.length(), ") and be at least the keep mask's (", current.length, ")"));
  }
  const uint64_t n = seq.length;
  const uint64_t heavy = config.heavy_tokens.value_or(FloorRatio(config.heavy_ratio, n));
  const uint64_t recent = config.recent_tokens.value_or(FloorRatio(config.recent_ratio, n));
  const uint64_t protected_end = config.protect_prompt ? std::min(seq.prompt_tokens, n) : 0;
  const uint64_t recent_begin = n > recent ? n - recent : 0;
  KeepMask out = current.Extended(n);
  std::vector<uint64_t> keys;
  for (uint32_t l = 0; l < out.num_layers; ++l) {
    for (uint32_t h = 0; h < out.num_kv_heads; ++h) {
      absl::Span<const float> s = scores.Scores(l, h);
      keys.clear();
      for (uint64_t i = protected_end; i < recent_begin; ++i) {
        if (out.Kept(l, h, i)) keys.push_back(RankKey(s[i], static_cast<uint32_t>(i)));
      }
      if (keys.size() <= heavy) continue;
      const size_t evict = keys.size() - heavy;
      std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(evict), keys.end());
      for (size_t k = 0; k < evict; ++k) {
        out.keep[out.Index(l, h, static_cast<uint32_t>(keys[k]))] = 0;
      }
    }
  }
  return out;
}

}  // namespace kvtier::tiering
