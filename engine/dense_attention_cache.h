#ifndef KVTIER_ENGINE_DENSE_ATTENTION_CACHE_H_
#define KVTIER_ENGINE_DENSE_ATTENTION_CACHE_H_

// The reference AttentionCache: every position of every layer in contiguous f32 arrays, exact
// causal GQA softmax attention. The engine's tests use it as ground truth; the tiered store must
// reproduce its outputs bit for bit when nothing is compressed or evicted.

#include <cstdint>
#include <vector>

#include "engine/quant.h"
#include "engine/thread_pool.h"
#include "worker/attention_cache.h"

namespace kvtier::engine {

// Not thread-safe (one decode loop drives it), like every AttentionCache.
class DenseAttentionCache final : public worker::AttentionCache {
 public:
  // `pool` (optional, not owned, must outlive the cache) splits Attend over query heads;
  // results do not depend on it. `max_positions` (0 = unlimited) bounds Append.
  explicit DenseAttentionCache(const worker::AttentionShape& shape, ThreadPool* pool = nullptr,
                               uint32_t max_positions = 0);

  uint32_t Length(uint32_t layer) const override;
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override;
  // For query i of n (position p = Length - n + i) and head h (kv head h / group):
  // softmax_j≤p(scale · q·k_j) then Σ_j w_j v_j, accumulated in f32 in position order.
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override;

  const worker::AttentionShape& shape() const { return shape_; }
  // Bytes of K and V stored.
  size_t bytes() const;

 private:
  worker::AttentionShape shape_;
  ThreadPool* pool_;
  uint32_t max_positions_;
  KernelIsa isa_;
  std::vector<std::vector<float>> k_;  // [layer][pos][kv_head][head_dim]
  std::vector<std::vector<float>> v_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_DENSE_ATTENTION_CACHE_H_
