#include "core/tiering/scores.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::tiering {

ScoreAccumulator::ScoreAccumulator(uint32_t num_layers, uint32_t num_heads, uint32_t layer_groups)
    : num_layers_(num_layers),
      num_heads_(num_heads),
      layer_groups_(layer_groups),
      scores_(layer_groups),
      frozen_(layer_groups) {}

absl::StatusOr<ScoreAccumulator> ScoreAccumulator::Create(uint32_t num_layers, uint32_t num_heads,
                                                          uint32_t layer_groups) {
  if (num_layers == 0) return absl::InvalidArgumentError("num_layers must be positive, got 0");
  if (num_heads == 0) return absl::InvalidArgumentError("num_heads must be positive, got 0");
  if (layer_groups == 0 || layer_groups > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_groups must be in [1, num_layers = ", num_layers, "], got ", layer_groups));
  }
  return ScoreAccumulator(num_layers, num_heads, layer_groups);
}

absl::Status ScoreAccumulator::AddStep(absl::Span<const float> attention, uint64_t length,
                                       AttentionLayout layout) {
  return Add(attention, length, layout, "attention");
}

absl::Status ScoreAccumulator::SeedPrefill(absl::Span<const float> column_sums, uint64_t length,
                                           AttentionLayout layout) {
  return Add(column_sums, length, layout, "column_sums");
}

absl::Status ScoreAccumulator::Add(absl::Span<const float> attention, uint64_t length,
                                   AttentionLayout layout, absl::string_view field) {
  const uint64_t heads = layout == AttentionLayout::kPerHead ? num_heads_ : 1;
  const uint64_t expected = uint64_t{num_layers_} * heads * length;
  if (attention.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", attention.size(), " values, expected num_layers × ",
        layout == AttentionLayout::kPerHead ? "num_heads × " : "", "length = ", expected));
  }
  if (length < length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("length must not shrink: got ", length, " after ", length_));
  }
  length_ = length;
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    scores_[g].resize(length, 0.0f);
    frozen_[g].resize(length, 0);
  }
  const double inv_heads = 1.0 / static_cast<double>(num_heads_);
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    step_sum_.assign(length, 0.0);
    step_count_.assign(length, 0);
    for (uint32_t layer = GroupBegin(g); layer < GroupBegin(g + 1); ++layer) {
      const float* base = attention.data() + uint64_t{layer} * heads * length;
      for (uint64_t i = 0; i < length; ++i) {
        double sum = 0;
        for (uint64_t h = 0; h < heads; ++h) sum += base[h * length + i];
        const double mean = sum * inv_heads;
        if (!std::isfinite(mean)) continue;
        step_sum_[i] += mean;
        ++step_count_[i];
      }
    }
    std::vector<float>& s = scores_[g];
    for (uint64_t i = 0; i < length; ++i) {
      if (step_count_[i] == 0 || frozen_[g][i]) continue;
      s[i] = static_cast<float>(s[i] + step_sum_[i] / step_count_[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status ScoreAccumulator::AddScores(uint32_t group, absl::Span<const float> gained) {
  if (group >= layer_groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat("group must be below layer_groups = ", layer_groups_, ", got ", group));
  }
  if (gained.size() < length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gained has ", gained.size(), " positions; the sequence has ", length_));
  }
  length_ = gained.size();
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    scores_[g].resize(length_, 0.0f);
    frozen_[g].resize(length_, 0);
  }
  std::vector<float>& s = scores_[group];
  for (uint64_t i = 0; i < gained.size(); ++i) {
    if (frozen_[group][i] || !std::isfinite(gained[i])) continue;
    s[i] += gained[i];
  }
  return absl::OkStatus();
}

void AccumulateDeviceMass(absl::Span<const float> mass, float weight, absl::Span<float> acc) {
  const size_t n = std::min(mass.size(), acc.size());
  for (size_t i = 0; i < n; ++i) acc[i] += mass[i] * weight;
}

absl::Status ScoreAccumulator::Truncate(uint64_t length) {
  if (length > length_) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", length, " exceeds the sequence's ", length_));
  }
  length_ = length;
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    scores_[g].resize(length);
    frozen_[g].resize(length);
  }
  return absl::OkStatus();
}

absl::Status ScoreAccumulator::Freeze(uint32_t group, Range positions) {
  if (group >= layer_groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat("group must be below layer_groups = ", layer_groups_, ", got ", group));
  }
  const uint64_t end = std::min(positions.end, length_);
  for (uint64_t i = positions.begin; i < end; ++i) frozen_[group][i] = 1;
  return absl::OkStatus();
}

absl::Status ScoreAccumulator::FreezeEvicted(const Placement& placement, uint32_t page_tokens) {
  if (page_tokens == 0) return absl::InvalidArgumentError("page_tokens must be positive, got 0");
  if (placement.num_groups != layer_groups_) {
    return absl::InvalidArgumentError(absl::StrCat("placement.num_groups (", placement.num_groups,
                                                   ") differs from layer_groups (", layer_groups_,
                                                   ")"));
  }
  if (placement.tiers.size() != uint64_t{placement.num_groups} * placement.num_pages) {
    return absl::InvalidArgumentError("placement.tiers does not match num_groups × num_pages");
  }
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    for (uint32_t p = 0; p < placement.num_pages; ++p) {
      if (placement.at(g, p) != Tier::kT3) continue;
      const uint64_t begin = uint64_t{p} * page_tokens;
      (void)Freeze(g, {begin, begin + page_tokens});
    }
  }
  return absl::OkStatus();
}

absl::Span<const float> ScoreAccumulator::TokenScores(uint32_t g) const { return scores_[g]; }

bool ScoreAccumulator::IsFrozen(uint32_t g, uint64_t position) const {
  return frozen_[g][position] != 0;
}

absl::StatusOr<std::vector<float>> ScoreAccumulator::PageScores(uint32_t g, uint32_t page_tokens,
                                                                PageScoreMode mode) const {
  if (g >= layer_groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat("group must be below layer_groups = ", layer_groups_, ", got ", g));
  }
  if (page_tokens == 0) return absl::InvalidArgumentError("page_tokens must be positive, got 0");
  return AggregatePages(scores_[g], page_tokens, mode);
}

absl::StatusOr<std::vector<float>> ScoreAccumulator::AllPageScores(uint32_t page_tokens,
                                                                   PageScoreMode mode) const {
  if (page_tokens == 0) return absl::InvalidArgumentError("page_tokens must be positive, got 0");
  std::vector<float> out;
  for (uint32_t g = 0; g < layer_groups_; ++g) {
    std::vector<float> pages = AggregatePages(scores_[g], page_tokens, mode);
    out.insert(out.end(), pages.begin(), pages.end());
  }
  return out;
}

std::vector<float> AggregatePages(absl::Span<const float> token_scores, uint32_t page_tokens,
                                  PageScoreMode mode) {
  const uint64_t n = token_scores.size();
  std::vector<float> pages((n + page_tokens - 1) / page_tokens);
  for (uint64_t p = 0; p < pages.size(); ++p) {
    const uint64_t begin = p * page_tokens;
    const uint64_t end = std::min<uint64_t>(n, begin + page_tokens);
    double acc = mode == PageScoreMode::kMax ? token_scores[begin] : 0.0;
    for (uint64_t i = begin; i < end; ++i) {
      acc = mode == PageScoreMode::kMax ? std::max<double>(acc, token_scores[i])
                                        : acc + token_scores[i];
    }
    pages[p] = static_cast<float>(acc);
  }
  return pages;
}

}  // namespace kvtier::tiering
