#include "engine/eval/head_probe.h"

#include <algorithm>
#include <cmath>

#include "core/status/status_macros.h"

namespace kvtier::engine {

HeadProbeCache::HeadProbeCache(const worker::AttentionShape& shape, worker::AttentionCache* inner,
                               uint32_t query_capacity)
    : shape_(shape),
      inner_(inner),
      query_capacity_(query_capacity),
      keys_(shape.num_layers),
      dropped_(size_t{shape.num_layers} * shape.num_kv_heads),
      queries_(shape.num_layers),
      query_pos_(shape.num_layers) {}

absl::Status HeadProbeCache::Append(uint32_t layer, const float* k, const float* v, uint32_t n) {
  RETURN_IF_ERROR(inner_->Append(layer, k, v, n));
  const size_t row = size_t{shape_.num_kv_heads} * shape_.head_dim;
  keys_[layer].insert(keys_[layer].end(), k, k + n * row);
  return absl::OkStatus();
}

absl::Status HeadProbeCache::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                    float* position_mass) {
  RETURN_IF_ERROR(inner_->Attend(layer, q, n, out, position_mass));
  KeepQueries(layer, q, n);
  return absl::OkStatus();
}

void HeadProbeCache::KeepQueries(uint32_t layer, const float* q, uint32_t n) {
  const size_t row = size_t{shape_.num_q_heads} * shape_.head_dim;
  const uint32_t len = inner_->Length(layer);
  const uint32_t first = n > query_capacity_ ? n - query_capacity_ : 0;
  for (uint32_t i = first; i < n; ++i) {
    queries_[layer].emplace_back(q + i * row, q + (i + 1) * row);
    query_pos_[layer].push_back(len - n + i);
  }
  while (queries_[layer].size() > query_capacity_) {
    queries_[layer].pop_front();
    query_pos_[layer].pop_front();
  }
}

void HeadProbeCache::set_query_capacity(uint32_t capacity) {
  query_capacity_ = capacity;
  for (uint32_t l = 0; l < shape_.num_layers; ++l) {
    while (queries_[l].size() > capacity) {
      queries_[l].pop_front();
      query_pos_[l].pop_front();
    }
  }
}

void HeadProbeCache::Drop(uint32_t layer, uint32_t kv_head, uint32_t position) {
  std::vector<uint8_t>& d = dropped_[size_t{layer} * shape_.num_kv_heads + kv_head];
  if (d.size() <= position) d.resize(position + 1, 0);
  d[position] = 1;
}

bool HeadProbeCache::Dropped(uint32_t layer, uint32_t kv_head, uint32_t position) const {
  const std::vector<uint8_t>& d = dropped_[size_t{layer} * shape_.num_kv_heads + kv_head];
  return position < d.size() && d[position] != 0;
}

uint32_t HeadProbeCache::stored_queries() const {
  return queries_.empty() ? 0 : static_cast<uint32_t>(queries_[0].size());
}

void HeadProbeCache::Row(uint32_t layer, size_t query, uint32_t head, float* dst,
                         std::vector<float>& logits) const {
  const uint32_t L = inner_->Length(0), hd = shape_.head_dim;
  const uint32_t kv = head / (shape_.num_q_heads / shape_.num_kv_heads);
  const float* qh = queries_[layer][query].data() + size_t{head} * hd;
  const uint32_t qpos = query_pos_[layer][query];
  logits.resize(L);
  double m = -INFINITY;
  for (uint32_t p = 0; p <= qpos && p < L; ++p) {
    if (Dropped(layer, kv, p)) continue;
    const float* k = keys_[layer].data() + (size_t{p} * shape_.num_kv_heads + kv) * hd;
    float s = 0;
    for (uint32_t d = 0; d < hd; ++d) s += qh[d] * k[d];
    logits[p] = s * shape_.scale;
    m = std::max(m, double{logits[p]});
  }
  double sum = 0;
  for (uint32_t p = 0; p <= qpos && p < L; ++p) {
    if (Dropped(layer, kv, p)) continue;
    const double e = std::exp(logits[p] - m);
    dst[p] = static_cast<float>(e);
    sum += e;
  }
  if (sum > 0) {
    for (uint32_t p = 0; p <= qpos && p < L; ++p) dst[p] = static_cast<float>(dst[p] / sum);
  }
}

void HeadProbeCache::ComputeRows(uint32_t rows, std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), H = shape_.num_q_heads;
  out.assign(size_t{shape_.num_layers} * H * rows * L, 0.f);
  std::vector<float> logits;
  for (uint32_t l = 0; l < shape_.num_layers; ++l) {
    const size_t nq = queries_[l].size();
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t h = 0; h < H; ++h) {
        Row(l, nq - rows + r, h, out.data() + ((size_t{l} * H + h) * rows + r) * L, logits);
      }
    }
  }
}

void HeadProbeCache::ColumnSums(std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), H = shape_.num_q_heads;
  out.assign(size_t{shape_.num_layers} * H * L, 0.f);
  std::vector<float> logits, row(L);
  for (uint32_t l = 0; l < shape_.num_layers; ++l) {
    for (size_t q = 0; q < queries_[l].size(); ++q) {
      for (uint32_t h = 0; h < H; ++h) {
        std::fill(row.begin(), row.end(), 0.f);
        Row(l, q, h, row.data(), logits);
        float* dst = out.data() + (size_t{l} * H + h) * L;
        for (uint32_t p = 0; p < L; ++p) dst[p] += row[p];
      }
    }
  }
}

void HeadProbeCache::KeysByHead(std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), kvh = shape_.num_kv_heads, hd = shape_.head_dim;
  out.resize(size_t{shape_.num_layers} * kvh * L * hd);
  for (uint32_t l = 0; l < shape_.num_layers; ++l) {
    for (uint32_t h = 0; h < kvh; ++h) {
      for (uint32_t p = 0; p < L; ++p) {
        std::copy_n(keys_[l].data() + (size_t{p} * kvh + h) * hd, hd,
                    out.data() + ((size_t{l} * kvh + h) * L + p) * hd);
      }
    }
  }
}

}  // namespace kvtier::engine
