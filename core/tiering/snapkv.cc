#include "core/tiering/snapkv.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtier::tiering {

absl::StatusOr<KeepMask> SnapKvSelect(const SnapKvInput& in, const SnapKvConfig& config) {
  if (in.num_kv_heads == 0 || in.num_q_heads == 0 || in.num_q_heads % in.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads ", in.num_q_heads,
                                                   " must be a positive multiple of num_kv_heads ",
                                                   in.num_kv_heads));
  }
  if (in.queries > in.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries ", in.queries, " exceeds length ", in.length));
  }
  const uint64_t expect = uint64_t{in.num_layers} * in.num_q_heads * in.queries * in.length;
  if (in.attention.size() != expect) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention has ", in.attention.size(), " floats, expected ", expect));
  }
  KeepMask mask = KeepMask::AllKept(in.num_layers, in.num_kv_heads, in.length);
  const uint64_t L = in.length, observed = L - in.queries;  // positions that are voted on
  const uint64_t keep = std::min<uint64_t>(L, std::max<uint64_t>(config.budget_tokens, in.queries));
  if (keep >= L) return mask;
  const uint64_t voted_keep = keep - in.queries;
  const uint32_t group = in.num_q_heads / in.num_kv_heads;
  const int64_t half = config.pool_kernel / 2;
  std::vector<float> votes(observed), pooled(observed);
  std::vector<uint64_t> order(observed);
  for (uint32_t l = 0; l < in.num_layers; ++l) {
    for (uint32_t kvh = 0; kvh < in.num_kv_heads; ++kvh) {
      std::fill(votes.begin(), votes.end(), 0.f);
      for (uint32_t g = 0; g < group; ++g) {
        const uint64_t head = uint64_t{kvh} * group + g;
        for (uint32_t q = 0; q < in.queries; ++q) {
          const float* row =
              in.attention.data() + ((uint64_t{l} * in.num_q_heads + head) * in.queries + q) * L;
          for (uint64_t p = 0; p < observed; ++p) votes[p] += row[p];
        }
      }
      for (uint64_t p = 0; p < observed; ++p) {
        const uint64_t b = p > uint64_t(half) ? p - half : 0;
        const uint64_t e = std::min<uint64_t>(observed, p + half + 1);
        pooled[p] = *std::max_element(votes.begin() + b, votes.begin() + e);
      }
      std::iota(order.begin(), order.end(), 0);
      // Ties go to the earlier position, so the selection is deterministic.
      std::stable_sort(order.begin(), order.end(),
                       [&](uint64_t a, uint64_t b) { return pooled[a] > pooled[b]; });
      for (uint64_t i = voted_keep; i < observed; ++i) mask.keep[mask.Index(l, kvh, order[i])] = 0;
    }
  }
  return mask;
}

}  // namespace kvtier::tiering
