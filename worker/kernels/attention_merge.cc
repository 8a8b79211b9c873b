#include "worker/kernels/attention_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvtier::worker::kernels {

void MergeAttentionPartials(absl::Span<const AttentionPartial> parts, const MergeShape& shape,
                            float* out, float* lse, float* position_mass) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t d = shape.head_dim;
  std::vector<float> weight(parts.size());
  // weights[h][i] of the last query, for the mass (num_queries == 1).
  std::vector<float> head_weight(size_t{shape.num_q_heads} * parts.size());
  for (uint32_t t = 0; t < shape.num_queries; ++t) {
    for (uint32_t h = 0; h < shape.num_q_heads; ++h) {
      const size_t row = size_t{t} * shape.num_q_heads + h;
      float m = kNegInf;
      for (const AttentionPartial& part : parts) m = std::max(m, part.lse[row]);
      float* o = out + row * d;
      std::fill(o, o + d, 0.f);
      if (m == kNegInf) {
        if (lse != nullptr) lse[row] = kNegInf;
        std::fill(weight.begin(), weight.end(), 0.f);
      } else {
        float z = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
          weight[i] = std::exp(parts[i].lse[row] - m);
          z += weight[i];
        }
        for (size_t i = 0; i < parts.size(); ++i) {
          weight[i] /= z;
          const float* src = parts[i].out + row * d;
          for (size_t j = 0; j < d; ++j) o[j] += weight[i] * src[j];
        }
        if (lse != nullptr) lse[row] = m + std::log(z);
      }
      std::copy(weight.begin(), weight.end(), head_weight.begin() + h * parts.size());
    }
  }
  if (position_mass == nullptr || shape.num_queries != 1) return;
  std::fill(position_mass, position_mass + shape.length, 0.f);
  for (uint32_t h = 0; h < shape.num_q_heads; ++h) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const float w = head_weight[h * parts.size() + i];
      if (w == 0 || parts[i].head_mass == nullptr) continue;
      const float* src = parts[i].head_mass + size_t{h} * shape.length;
      for (uint32_t p = 0; p < shape.length; ++p) position_mass[p] += w * src[p];
    }
  }
}

}  // namespace kvtier::worker::kernels
