#include "engine/dense_attention_cache.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace kvtier::engine {

DenseAttentionCache::DenseAttentionCache(const worker::AttentionShape& shape, ThreadPool* pool,
                                         uint32_t max_positions)
    : shape_(shape),
      pool_(pool),
      max_positions_(max_positions),
      isa_(DetectKernelIsa()),
      k_(shape.num_layers),
      v_(shape.num_layers) {}

uint32_t DenseAttentionCache::Length(uint32_t layer) const {
  if (layer >= shape_.num_layers) return 0;
  return static_cast<uint32_t>(k_[layer].size() / (shape_.num_kv_heads * shape_.head_dim));
}

size_t DenseAttentionCache::bytes() const {
  size_t n = 0;
  for (uint32_t l = 0; l < shape_.num_layers; ++l) n += (k_[l].size() + v_[l].size()) * 4;
  return n;
}

absl::Status DenseAttentionCache::Append(uint32_t layer, const float* k, const float* v,
                                         uint32_t n) {
  if (layer >= shape_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d out of range (cache has %d layers)", layer, shape_.num_layers));
  }
  if (max_positions_ != 0 && Length(layer) + n > max_positions_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("appending %d positions to %d exceeds the cache capacity of %d", n,
                        Length(layer), max_positions_));
  }
  const size_t count = size_t{n} * shape_.num_kv_heads * shape_.head_dim;
  k_[layer].insert(k_[layer].end(), k, k + count);
  v_[layer].insert(v_[layer].end(), v, v + count);
  return absl::OkStatus();
}

absl::Status DenseAttentionCache::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                         float* position_mass) {
  if (layer >= shape_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer %d out of range (cache has %d layers)", layer, shape_.num_layers));
  }
  const uint32_t len = Length(layer);
  if (n > len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Attend of %d queries but only %d positions cached", n, len));
  }
  const uint32_t hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, d = shape_.head_dim;
  if (hkv == 0 || hq % hkv != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_q_heads %d not a multiple of num_kv_heads %d", hq, hkv));
  }
  const uint32_t group = hq / hkv;
  const float* kbase = k_[layer].data();
  const float* vbase = v_[layer].data();
  const VecDotFn dot = GetVecDot(GgmlType::kF32, isa_);
  const AxpyFn axpy = GetAxpy(isa_);
  const size_t items = size_t{n} * hq;
  // Softmax statistics per (query, head), kept for position_mass: max score and 1/Σexp.
  std::vector<float> row_max(items), row_inv(items);
  auto score = [&](size_t item, uint32_t j) {
    const uint32_t i = static_cast<uint32_t>(item / hq), h = static_cast<uint32_t>(item % hq);
    return shape_.scale *
           dot(kbase + (size_t{j} * hkv + h / group) * d, q + (size_t{i} * hq + h) * d, d);
  };
  auto run = [&](size_t begin, size_t end) {
    std::vector<float> w(len);
    for (size_t item = begin; item < end; ++item) {
      const uint32_t i = static_cast<uint32_t>(item / hq), h = static_cast<uint32_t>(item % hq);
      const uint32_t p = len - n + i, kvh = h / group;
      float mx = -INFINITY;
      for (uint32_t j = 0; j <= p; ++j) mx = std::max(mx, w[j] = score(item, j));
      float sum = 0;
      for (uint32_t j = 0; j <= p; ++j) sum += (w[j] = std::exp(w[j] - mx));
      const float inv = 1.f / sum;
      row_max[item] = mx;
      row_inv[item] = inv;
      float* o = out + item * d;
      std::fill(o, o + d, 0.f);
      for (uint32_t j = 0; j <= p; ++j) {
        axpy(w[j] * inv, vbase + (size_t{j} * hkv + kvh) * d, o, d);
      }
    }
  };
  // position_mass[j] = Σ over (query, head) in order of the same weights (recomputed from the
  // saved statistics, so memory stays O(n·heads + len) and the sum order is fixed).
  auto mass = [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j) {
      float m = 0;
      const size_t first_query = j + n > len ? j + n - len : 0;  // queries with p >= j
      for (size_t item = first_query * hq; item < items; ++item) {
        m += std::exp(score(item, static_cast<uint32_t>(j)) - row_max[item]) * row_inv[item];
      }
      position_mass[j] = m;
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(items, run);
    if (position_mass != nullptr) pool_->ParallelFor(len, mass, 16);
  } else {
    run(0, items);
    if (position_mass != nullptr) mass(0, len);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::engine
