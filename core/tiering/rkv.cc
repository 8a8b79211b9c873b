#include "core/tiering/rkv.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"

namespace kvtier::tiering {
namespace {

const float* AttentionRow(const RkvInput& in, uint32_t layer, uint32_t q_head, uint32_t row) {
  return in.attention.data() +
         ((uint64_t{layer} * in.num_q_heads + q_head) * in.queries + row) * in.length;
}

const float* Key(const RkvInput& in, uint32_t layer, uint32_t kv_head, uint64_t position) {
  return in.keys.data() +
         ((uint64_t{layer} * in.num_kv_heads + kv_head) * in.length + position) * in.head_dim;
}

absl::Status CheckInput(const RkvInput& in, const KeepMask& current, const RkvConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(current.Validate());
  if (in.num_layers == 0 || in.num_kv_heads == 0 || in.head_dim == 0 ||
      in.num_q_heads % in.num_kv_heads != 0 || in.num_q_heads == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input shape must be positive with num_q_heads a multiple of num_kv_heads, got layers ",
        in.num_layers, ", q heads ", in.num_q_heads, ", kv heads ", in.num_kv_heads, ", head_dim ",
        in.head_dim));
  }
  if (current.num_layers != in.num_layers || current.num_kv_heads != in.num_kv_heads ||
      current.length > in.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep mask (", current.num_layers, " layers × ", current.num_kv_heads,
                     " kv heads × ", current.length, ") does not fit the input (", in.num_layers,
                     " × ", in.num_kv_heads, " × ", in.length, ")"));
  }
  const uint64_t queries = std::min<uint64_t>(config.alpha, in.length);
  if (in.queries != queries) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries must be min(alpha, length) = ", queries, ", got ", in.queries));
  }
  const uint64_t attention = uint64_t{in.num_layers} * in.num_q_heads * queries * in.length;
  if (in.attention.size() != attention) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention has ", in.attention.size(), " values, expected ", attention));
  }
  const uint64_t keys = uint64_t{in.num_layers} * in.num_kv_heads * in.length * in.head_dim;
  if (in.keys.size() != keys) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys has ", in.keys.size(), " values, expected ", keys));
  }
  return absl::OkStatus();
}

// Non-finite attention or keys at kept positions of (layer, kv head).
absl::Status CheckFinite(const RkvInput& in, uint32_t layer, uint32_t kv_head,
                         absl::Span<const uint64_t> kept) {
  const uint32_t group = in.num_q_heads / in.num_kv_heads;
  for (uint64_t j : kept) {
    for (uint32_t q = kv_head * group; q < (kv_head + 1) * group; ++q) {
      for (uint32_t r = 0; r < in.queries; ++r) {
        if (!std::isfinite(AttentionRow(in, layer, q, r)[j])) {
          return absl::InvalidArgumentError(absl::StrCat("attention[layer ", layer, ", q head ", q,
                                                         ", query ", r, ", position ", j,
                                                         "] is not finite"));
        }
      }
    }
    const float* k = Key(in, layer, kv_head, j);
    for (uint32_t d = 0; d < in.head_dim; ++d) {
      if (!std::isfinite(k[d])) {
        return absl::InvalidArgumentError(absl::StrCat("keys[layer ", layer, ", kv head ", kv_head,
                                                       ", position ", j, "] is not finite"));
      }
    }
  }
  return absl::OkStatus();
}

// Importance of the non-window kept positions (compact, in cache order).
std::vector<double> Importance(const RkvInput& in, uint32_t layer, uint32_t kv_head,
                               absl::Span<const uint64_t> cand, const RkvConfig& config) {
  const uint32_t group = in.num_q_heads / in.num_kv_heads;
  const size_t m = cand.size();
  const int64_t half = config.pool_width / 2;
  std::vector<double> out(m, 0.0), mean(m);
  for (uint32_t q = kv_head * group; q < (kv_head + 1) * group; ++q) {
    std::fill(mean.begin(), mean.end(), 0.0);
    for (uint32_t r = 0; r < in.queries; ++r) {
      const float* row = AttentionRow(in, layer, q, r);
      double total = 0;
      for (uint64_t j : cand) total += row[j];
      if (total <= 0) continue;
      for (size_t c = 0; c < m; ++c) mean[c] += row[cand[c]] / total / in.queries;
    }
    for (int64_t c = 0; c < static_cast<int64_t>(m); ++c) {
      double best = mean[c];
      for (int64_t o = std::max<int64_t>(0, c - half);
           o <= std::min<int64_t>(static_cast<int64_t>(m) - 1, c + half); ++o) {
        best = std::max(best, mean[o]);
      }
      out[c] += best / group;
    }
  }
  return out;
}

// One row's similarities to kLanes positions at once, in baseline-ISA vectors (two doubles),
// each lane summing over head_dim in order with a separate multiply and add (no fused
// multiply-add), so each rounds as a scalar dot product would.
using Pair = double __attribute__((vector_size(2 * sizeof(double))));
constexpr size_t kPairs = 4, kLanes = 2 * kPairs;
Pair Load(const double* p) {
  Pair v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Softmax over the cache of the mean (zeroed-duplicate) cosine similarity.
std::vector<double> Redundancy(const RkvInput& in, uint32_t layer, uint32_t kv_head,
                               absl::Span<const uint64_t> kept, double threshold) {
  const size_t n = kept.size(), hd = in.head_dim, blocks = (n + kLanes - 1) / kLanes;
  // Unit keys, row-major and in blocks of kLanes positions ([block][d][lane]).
  std::vector<double> unit(n * hd), blocked(blocks * hd * kLanes, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const float* k = Key(in, layer, kv_head, kept[i]);
    double norm = 0;
    for (uint32_t d = 0; d < hd; ++d) norm += double{k[d]} * k[d];
    norm = std::sqrt(norm) + 1e-8;
    for (uint32_t d = 0; d < hd; ++d) {
      unit[i * hd + d] = k[d] / norm;
      blocked[(i / kLanes * hd + d) * kLanes + i % kLanes] = unit[i * hd + d];
    }
  }
  // sim(i, j) = sim(j, i) bit for bit (the same products summed in the same order): each pair is
  // computed once, by row min(i, j), and kept for the later row in `lower`.
  std::vector<double> column(n, 0.0), row(blocks * kLanes);
  std::vector<double> lower(n > 1 ? n * (n - 1) / 2 : 0);  // sim(i, j), j < i, at i(i−1)/2 + j
  for (size_t i = 0; i < n; ++i) {
    const double* ui = unit.data() + i * hd;
    std::copy_n(lower.data() + i * (i - 1) / 2, i, row.data());  // i = 0: nothing
    for (size_t b = i / kLanes; b < blocks; ++b) {
      const double* block = blocked.data() + b * hd * kLanes;
      Pair d0 = {}, d1 = {}, d2 = {}, d3 = {};  // named, so they stay in registers
      for (size_t d = 0; d < hd; ++d) {
        const Pair x = {ui[d], ui[d]};
        const double* u = block + d * kLanes;
        d0 += x * Load(u);
        d1 += x * Load(u + 2);
        d2 += x * Load(u + 4);
        d3 += x * Load(u + 6);
      }
      const Pair dots[kPairs] = {d0, d1, d2, d3};
      double lanes[kLanes];
      std::memcpy(lanes, dots, sizeof(dots));
      for (size_t v = 0; v < kLanes; ++v) {
        const size_t j = b * kLanes + v;
        if (j <= i || j >= n) continue;
        row[j] = lanes[v];
        lower[j * (j - 1) / 2 + i] = lanes[v];
      }
    }
    row[i] = 0;
    size_t last_duplicate = n;
    for (size_t j = 0; j < n; ++j) {
      if (j != i && row[j] > threshold) last_duplicate = j;
    }
    if (last_duplicate < n) row[last_duplicate] = 0;
    for (size_t j = 0; j < n; ++j) column[j] += row[j] / static_cast<double>(n);
  }
  const double top = n > 0 ? *std::max_element(column.begin(), column.end()) : 0.0;
  double total = 0;
  for (double& c : column) total += (c = std::exp(c - top));
  for (double& c : column) c /= total;
  return column;
}

}  // namespace

absl::Status RkvConfig::Validate() const {
  if (!(lambda >= 0.0 && lambda <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("lambda must be in [0, 1], got ", lambda));
  }
  if (pool_width % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat("pool_width must be odd, got ", pool_width));
  }
  if (alpha == 0) return absl::InvalidArgumentError("alpha must be positive, got 0");
  if (budget_tokens < alpha) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_tokens (", budget_tokens, ") must be at least alpha (", alpha, ")"));
  }
  return absl::OkStatus();
}

bool RkvDue(const KeepMask& mask, const RkvConfig& config) {
  for (uint32_t l = 0; l < mask.num_layers; ++l) {
    for (uint32_t h = 0; h < mask.num_kv_heads; ++h) {
      if (mask.KeptCount(l, h) >= config.budget_tokens + config.buffer_tokens) return true;
    }
  }
  return false;
}

std::vector<double> RkvScores(const RkvInput& in, uint32_t layer, uint32_t kv_head,
                              absl::Span<const uint64_t> kept, const RkvConfig& config) {
  const uint64_t window_begin = in.length - in.queries;
  const size_t m =
      static_cast<size_t>(std::lower_bound(kept.begin(), kept.end(), window_begin) - kept.begin());
  const std::vector<double> importance = Importance(in, layer, kv_head, kept.subspan(0, m), config);
  const std::vector<double> redundancy =
      Redundancy(in, layer, kv_head, kept, config.similarity_threshold);
  std::vector<double> score(kept.size(), 0.0);
  for (size_t c = 0; c < kept.size(); ++c) {
    const double imp = c < m ? importance[c] : 0.0;
    score[c] = config.lambda * imp - (1.0 - config.lambda) * redundancy[c];
  }
  return score;
}

absl::StatusOr<KeepMask> RkvCompress(const RkvInput& in, const KeepMask& current,
                                     const RkvConfig& config) {
  RETURN_IF_ERROR(CheckInput(in, current, config));
  KeepMask out = current.Extended(in.length);
  const uint64_t window_begin = in.length - in.queries;
  const uint64_t prompt_end = config.protect_prompt ? std::min(in.prompt_tokens, in.length) : 0;
  std::vector<uint64_t> kept;
  for (uint32_t l = 0; l < in.num_layers; ++l) {
    for (uint32_t h = 0; h < in.num_kv_heads; ++h) {
      kept.clear();
      for (uint64_t j = 0; j < in.length; ++j) {
        if (out.Kept(l, h, j)) kept.push_back(j);
      }
      if (kept.size() <= config.budget_tokens) continue;
      RETURN_IF_ERROR(CheckFinite(in, l, h, kept));
      const std::vector<double> score = RkvScores(in, l, h, kept, config);
      // Candidates ranked by (score, position): the lowest are evicted.
      std::vector<std::pair<double, uint64_t>> cand;
      uint64_t protected_kept = 0;
      for (size_t c = 0; c < kept.size(); ++c) {
        if (kept[c] >= window_begin || kept[c] < prompt_end) {
          ++protected_kept;
        } else {
          cand.emplace_back(score[c], kept[c]);
        }
      }
      const uint64_t room =
          config.budget_tokens > protected_kept ? config.budget_tokens - protected_kept : 0;
      if (cand.size() <= room) continue;
      const size_t evict = cand.size() - room;
      std::nth_element(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(evict), cand.end());
      for (size_t c = 0; c < evict; ++c) out.keep[out.Index(l, h, cand[c].second)] = 0;
    }
  }
  return out;
}

}  // namespace kvtier::tiering
