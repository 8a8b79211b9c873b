#include "engine/eval/head_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status/status_macros.h"

namespace kvtier::engine {
namespace {

// logits[p] = scale · q·k_p over `blocks` blocks of 8 positions ([block][d][8]). Each lane sums
// over d in order with a separate multiply and add (no fused multiply-add), so every logit
// rounds as a scalar dot product would, on either instruction set.
using Quad = float __attribute__((vector_size(4 * sizeof(float))));
Quad Load(const float* p) {
  Quad v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void LogitsSse(const float* q, const float* keys, uint32_t hd, uint32_t blocks, float scale,
               float* logits) {
  for (uint32_t b = 0; b < blocks; ++b) {
    const float* block = keys + size_t{b} * hd * 8;
    Quad s0 = {}, s1 = {};  // named, so they stay in registers
    for (uint32_t d = 0; d < hd; ++d) {
      const Quad x = {q[d], q[d], q[d], q[d]};
      s0 += x * Load(block + size_t{d} * 8);
      s1 += x * Load(block + size_t{d} * 8 + 4);
    }
    const Quad s[2] = {s0 * scale, s1 * scale};
    std::memcpy(logits + size_t{b} * 8, s, sizeof(s));
  }
}

#if defined(__x86_64__)
using Oct = float __attribute__((vector_size(8 * sizeof(float))));

// AVX2 without FMA; two blocks at once, so two dependency chains overlap.
__attribute__((target("avx2"))) void LogitsAvx2(const float* q, const float* keys, uint32_t hd,
                                                uint32_t blocks, float scale, float* logits) {
  uint32_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const float* b0 = keys + size_t{b} * hd * 8;
    const float* b1 = b0 + size_t{hd} * 8;
    Oct s0 = {}, s1 = {};
    for (uint32_t d = 0; d < hd; ++d) {
      Oct k0, k1;
      std::memcpy(&k0, b0 + size_t{d} * 8, sizeof(k0));
      std::memcpy(&k1, b1 + size_t{d} * 8, sizeof(k1));
      s0 += q[d] * k0;
      s1 += q[d] * k1;
    }
    s0 *= scale;
    s1 *= scale;
    std::memcpy(logits + size_t{b} * 8, &s0, sizeof(s0));
    std::memcpy(logits + size_t{b + 1} * 8, &s1, sizeof(s1));
  }
  if (b < blocks) LogitsSse(q, keys + size_t{b} * hd * 8, hd, 1, scale, logits + size_t{b} * 8);
}
#endif

void Logits(const float* q, const float* keys, uint32_t hd, uint32_t blocks, float scale,
            float* logits) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return LogitsAvx2(q, keys, hd, blocks, scale, logits);
#endif
  LogitsSse(q, keys, hd, blocks, scale, logits);
}

}  // namespace

HeadProbeCache::HeadProbeCache(const worker::AttentionShape& shape, worker::AttentionCache* inner,
                               uint32_t query_capacity)
    : shape_(shape),
      inner_(inner),
      query_capacity_(query_capacity),
      key_blocks_(size_t{shape.num_layers} * shape.num_kv_heads),
      dropped_(size_t{shape.num_layers} * shape.num_kv_heads),
      queries_(shape.num_layers),
      query_pos_(shape.num_layers) {}

absl::Status HeadProbeCache::Append(uint32_t layer, const float* k, const float* v, uint32_t n) {
  RETURN_IF_ERROR(inner_->Append(layer, k, v, n));
  const uint32_t kvh = shape_.num_kv_heads, hd = shape_.head_dim;
  const uint32_t end = inner_->Length(layer), begin = end - n;
  const size_t blocks = (end + kLanes - 1) / kLanes;
  for (uint32_t h = 0; h < kvh; ++h) {
    std::vector<float>& b = key_blocks_[size_t{layer} * kvh + h];
    b.resize(blocks * hd * kLanes, 0.f);
    for (uint32_t p = begin; p < end; ++p) {
      const float* src = k + (size_t{p - begin} * kvh + h) * hd;
      float* dst = b.data() + size_t{p / kLanes} * hd * kLanes + p % kLanes;
      for (uint32_t d = 0; d < hd; ++d) dst[size_t{d} * kLanes] = src[d];
    }
  }
  return absl::OkStatus();
}

absl::Status HeadProbeCache::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                    float* position_mass) {
  RETURN_IF_ERROR(inner_->Attend(layer, q, n, out, position_mass));
  pristine_ = false;
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
  pristine_ = false;
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
  const uint32_t end = std::min(query_pos_[layer][query] + 1, L);
  const float* blocks = key_blocks_[size_t{layer} * shape_.num_kv_heads + kv].data();
  logits.resize(size_t{L + kLanes});
  static_assert(kLanes == 8);
  Logits(qh, blocks, hd, (end + kLanes - 1) / kLanes, shape_.scale, logits.data());
  const std::vector<uint8_t>& dropped = dropped_[size_t{layer} * shape_.num_kv_heads + kv];
  const uint32_t marked = static_cast<uint32_t>(std::min<size_t>(end, dropped.size()));
  const auto live = [&](uint32_t p) { return p >= marked || dropped[p] == 0; };
  double m = -INFINITY;
  for (uint32_t p = 0; p < end; ++p) {
    if (live(p)) m = std::max(m, double{logits[p]});
  }
  double sum = 0;
  for (uint32_t p = 0; p < end; ++p) {
    if (!live(p)) continue;
    const double e = std::exp(logits[p] - m);
    dst[p] = static_cast<float>(e);
    sum += e;
  }
  if (sum > 0) {
    for (uint32_t p = 0; p < end; ++p) dst[p] = static_cast<float>(dst[p] / sum);
  }
}

void HeadProbeCache::ForEachLayer(const std::function<void(uint32_t)>& f) const {
  if (runner_ == nullptr || runner_->concurrency() < 2) {
    for (uint32_t l = 0; l < shape_.num_layers; ++l) f(l);
    return;
  }
  runner_->Run(shape_.num_layers, f);
}

void HeadProbeCache::ComputeRows(uint32_t rows, std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), H = shape_.num_q_heads;
  if (Shares() && shared_->rows_length == L && shared_->rows >= rows) {
    // The last `rows` of the shared rows, per (layer, head).
    const uint32_t have = shared_->rows;
    out.resize(size_t{shape_.num_layers} * H * rows * L);
    for (size_t lh = 0; lh < size_t{shape_.num_layers} * H; ++lh) {
      std::copy_n(shared_->rows_data.data() + (lh * have + (have - rows)) * L, size_t{rows} * L,
                  out.data() + lh * rows * L);
    }
    return;
  }
  out.assign(size_t{shape_.num_layers} * H * rows * L, 0.f);
  ForEachLayer([&](uint32_t l) {
    std::vector<float> logits;
    const size_t nq = queries_[l].size();
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t h = 0; h < H; ++h) {
        Row(l, nq - rows + r, h, out.data() + ((size_t{l} * H + h) * rows + r) * L, logits);
      }
    }
  });
  if (Shares() && (shared_->rows_length != L || shared_->rows < rows)) {
    shared_->rows_length = L;
    shared_->rows = rows;
    shared_->rows_data = out;
  }
}

void HeadProbeCache::ColumnSums(std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), H = shape_.num_q_heads;
  const uint32_t nq = stored_queries();
  if (Shares() && shared_->sums_length == L && shared_->sums_queries == nq) {
    out = shared_->sums_data;
    return;
  }
  out.assign(size_t{shape_.num_layers} * H * L, 0.f);
  ForEachLayer([&](uint32_t l) {
    std::vector<float> logits, row(L);
    for (size_t q = 0; q < queries_[l].size(); ++q) {
      for (uint32_t h = 0; h < H; ++h) {
        std::fill(row.begin(), row.end(), 0.f);
        Row(l, q, h, row.data(), logits);
        float* dst = out.data() + (size_t{l} * H + h) * L;
        for (uint32_t p = 0; p < L; ++p) dst[p] += row[p];
      }
    }
  });
  if (Shares()) {
    shared_->sums_length = L;
    shared_->sums_queries = nq;
    shared_->sums_data = out;
  }
}

void HeadProbeCache::KeysByHead(std::vector<float>& out) const {
  const uint32_t L = inner_->Length(0), kvh = shape_.num_kv_heads, hd = shape_.head_dim;
  out.resize(size_t{shape_.num_layers} * kvh * L * hd);
  for (uint32_t l = 0; l < shape_.num_layers; ++l) {
    for (uint32_t h = 0; h < kvh; ++h) {
      const float* blocks = key_blocks_[size_t{l} * kvh + h].data();
      for (uint32_t p = 0; p < L; ++p) {
        const float* src = blocks + size_t{p / kLanes} * hd * kLanes + p % kLanes;
        float* dst = out.data() + ((size_t{l} * kvh + h) * L + p) * hd;
        for (uint32_t d = 0; d < hd; ++d) dst[d] = src[size_t{d} * kLanes];
      }
    }
  }
}

}  // namespace kvtier::engine
