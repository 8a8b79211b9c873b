#include "core/tiering/arkv.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "core/tiering/scores.h"
#include "core/tiering/selection.h"

namespace kvtier::tiering {
namespace {

absl::Status CheckAttention(absl::Span<const float> attention, uint64_t expected) {
  if (attention.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention has ", attention.size(), " values, expected ", expected));
  }
  for (size_t i = 0; i < attention.size(); ++i) {
    if (!std::isfinite(attention[i])) {
      return absl::InvalidArgumentError(absl::StrCat("attention[", i, "] is ", attention[i]));
    }
  }
  return absl::OkStatus();
}

// Mean (+ γ × unbiased variance when queries > 1) over the queries of one head, per position.
void HeadScore(const float* head, uint32_t queries, uint64_t length, double gamma,
               std::vector<double>& out) {
  for (uint64_t k = 0; k < length; ++k) {
    double mean = 0;
    for (uint32_t q = 0; q < queries; ++q) mean += head[uint64_t{q} * length + k];
    mean /= queries;
    double var = 0;
    if (queries > 1) {
      for (uint32_t q = 0; q < queries; ++q) {
        const double d = head[uint64_t{q} * length + k] - mean;
        var += d * d;
      }
      var /= queries - 1;
    }
    out[k] = mean + gamma * var;
  }
}

}  // namespace

absl::Status ArkvConfig::Validate() const {
  for (auto [field, tau] :
       {std::pair{"tau_entropy", tau_entropy}, std::pair{"tau_variance", tau_variance},
        std::pair{"tau_kurtosis", tau_kurtosis}}) {
    if (!(tau > 0) || !std::isfinite(tau)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " must be positive, got ", tau));
    }
  }
  if (!(gamma >= 0) || !std::isfinite(gamma)) {
    return absl::InvalidArgumentError(absl::StrCat("gamma must be non-negative, got ", gamma));
  }
  if (smoothing_width % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("smoothing_width must be odd, got ", smoothing_width));
  }
  if (observation_window == 0) {
    return absl::InvalidArgumentError("observation_window must be positive, got 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<ArkvLayerStats> ArkvPrefillStats(absl::Span<const float> attention,
                                                uint32_t num_heads, uint32_t queries,
                                                uint64_t length) {
  if (num_heads == 0 || queries == 0 || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads, queries and length must be positive, got ", num_heads, ", ",
                     queries, ", ", length));
  }
  RETURN_IF_ERROR(CheckAttention(attention, uint64_t{num_heads} * queries * length));
  ArkvLayerStats s;
  for (uint32_t h = 0; h < num_heads; ++h) {
    const float* head = attention.data() + uint64_t{h} * queries * length;
    for (uint64_t k = 0; k < length; ++k) {
      double mean = 0;
      for (uint32_t q = 0; q < queries; ++q) {
        const double p = head[uint64_t{q} * length + k];
        s.entropy -= p * std::log(p + 1e-10);
        mean += p;
      }
      mean /= queries;
      double m2 = 0, m4 = 0;
      for (uint32_t q = 0; q < queries; ++q) {
        const double d = head[uint64_t{q} * length + k] - mean;
        m2 += d * d;
        m4 += d * d * d * d;
      }
      if (queries > 1) s.variance += m2 / (queries - 1);
      m2 = std::max(m2 / queries, 1e-8);
      s.kurtosis += (m4 / queries) / (m2 * m2);
    }
  }
  return s;
}

absl::StatusOr<std::vector<double>> ArkvOqRatios(absl::Span<const ArkvLayerStats> stats,
                                                 const ArkvConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  if (stats.empty()) return absl::InvalidArgumentError("stats must name at least one layer");
  std::vector<double> oq(stats.size());
  for (size_t l = 0; l < stats.size(); ++l) {
    const ArkvLayerStats& s = stats[l];
    for (double v : {s.entropy, s.variance, s.kurtosis}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("stats[", l, "] must be finite and non-negative, got entropy ", s.entropy,
                         ", variance ", s.variance, ", kurtosis ", s.kurtosis));
      }
    }
    oq[l] = std::pow(s.entropy, 1 / config.tau_entropy) *
            std::pow(s.variance, 1 / config.tau_variance) *
            std::pow(s.kurtosis, 1 / config.tau_kurtosis);
  }
  const double top = *std::max_element(oq.begin(), oq.end());
  for (double& r : oq) r = top > 0 ? r / top : 1.0;
  return oq;
}

absl::StatusOr<std::vector<float>> ArkvHeavyHitterScores(absl::Span<const float> attention,
                                                         uint32_t num_q_heads,
                                                         uint32_t num_kv_heads, uint32_t queries,
                                                         uint64_t length,
                                                         const ArkvConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  if (num_q_heads == 0 || num_kv_heads == 0 || queries == 0 || num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_q_heads (", num_q_heads, ") must be a positive multiple of num_kv_heads (",
        num_kv_heads, ") and queries (", queries, ") positive"));
  }
  RETURN_IF_ERROR(CheckAttention(attention, uint64_t{num_q_heads} * queries * length));
  const uint32_t group = num_q_heads / num_kv_heads;
  const uint64_t ranked = length > config.recent_tokens ? length - config.recent_tokens : 0;
  const int64_t half = config.smoothing_width / 2;
  std::vector<float> out(uint64_t{num_kv_heads} * length, 0.0f);
  std::vector<double> raw(length);
  for (uint32_t q = 0; q < num_q_heads; ++q) {
    HeadScore(attention.data() + uint64_t{q} * queries * length, queries, length, config.gamma,
              raw);
    float* dst = out.data() + uint64_t{q / group} * length;
    for (int64_t k = 0; k < static_cast<int64_t>(ranked); ++k) {
      double sum = 0;  // zero padding, divisor = width (avg_pool1d, count_include_pad)
      for (int64_t o = std::max<int64_t>(0, k - half);
           o <= std::min<int64_t>(static_cast<int64_t>(ranked) - 1, k + half); ++o) {
        sum += raw[o];
      }
      dst[k] += static_cast<float>(sum / config.smoothing_width / group);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> ArkvLayerPageScores(absl::Span<const float> head_scores,
                                                       uint32_t num_kv_heads, uint64_t length,
                                                       uint32_t page_tokens, PageScoreMode mode) {
  if (page_tokens == 0) return absl::InvalidArgumentError("page_tokens must be positive, got 0");
  if (num_kv_heads == 0 || head_scores.size() != uint64_t{num_kv_heads} * length) {
    return absl::InvalidArgumentError(absl::StrCat("head_scores has ", head_scores.size(),
                                                   " values, expected num_kv_heads (", num_kv_heads,
                                                   ") × length (", length, ")"));
  }
  std::vector<float> mean(length, 0.0f);
  for (uint32_t h = 0; h < num_kv_heads; ++h) {
    for (uint64_t i = 0; i < length; ++i) {
      mean[i] += head_scores[uint64_t{h} * length + i] / static_cast<float>(num_kv_heads);
    }
  }
  return AggregatePages(mean, page_tokens, mode);
}

absl::StatusOr<Decision> ArkvDecide(const ArkvInput& in, const TieringConfig& config,
                                    const ArkvConfig& arkv) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(arkv.Validate());
  ASSIGN_OR_RETURN(Placement target, TargetShape(in.sequence, in.current, config.page_tokens));
  if (in.oq_ratios.size() != target.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("oq_ratios has ", in.oq_ratios.size(),
                                                   " entries, expected one per layer (",
                                                   target.num_groups, ")"));
  }
  if (in.page_scores.size() != target.tiers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_scores has ", in.page_scores.size(),
                     " entries, expected layers × pages = ", target.tiers.size()));
  }
  TieringConfig protect = config;
  protect.window_tokens = arkv.recent_tokens;
  const ProtectedPages protected_pages = HierarchyProtectedPages(protect, in.sequence);
  Decision d;
  std::vector<uint64_t> scratch;
  const uint32_t n = target.num_pages;
  for (uint32_t l = 0; l < target.num_groups; ++l) {
    const double ratio = in.oq_ratios[l];
    if (!(ratio >= 0 && ratio <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("oq_ratios[", l, "] must be in [0, 1], got ", ratio));
    }
    const Budgets budgets{
        .evict_ratio = config.budgets.evict_ratio, .hbm_ratio = 1, .compress_ratio = 1 - ratio};
    auto current = absl::MakeConstSpan(in.current.tiers)
                       .subspan(size_t{l} * in.current.num_pages, in.current.num_pages);
    ASSIGN_OR_RETURN(GroupStats stats,
                     SelectGroup(in.page_scores.subspan(size_t{l} * n, n), current, protected_pages,
                                 config.page_tokens, in.sequence.length, budgets, l,
                                 absl::MakeSpan(target.tiers).subspan(size_t{l} * n, n), &scratch));
    d.groups.push_back(stats);
  }
  d.placement = std::move(target);
  return d;
}

}  // namespace kvtier::tiering
