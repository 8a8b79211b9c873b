#ifndef KVTIER_WORKER_ATTENTION_CACHE_H_
#define KVTIER_WORKER_ATTENTION_CACHE_H_

// The seam between an inference engine and KV storage: the engine computes Q/K/V, the cache
// stores K/V wherever its tiers say and runs attention over them. The reference engine
// (engine/) talks only to this interface; the tiered store (worker/) implements it.

#include <cstdint>

#include "absl/status/status.h"

namespace kvtier::worker {

namespace kernels {
class TaskRunner;
}

// Shape of the attention a cache serves. Query head h reads KV head h / (q_heads / kv_heads).
struct AttentionShape {
  uint32_t num_layers = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  float scale = 0.f;  // usually 1/sqrt(head_dim)
};

// KV cache of ONE sequence. Not thread-safe: one decode loop drives it.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;

  // Positions stored so far in `layer` (all layers advance together during a forward pass).
  virtual uint32_t Length(uint32_t layer) const = 0;

  // Stores post-RoPE K and V of `n` new tokens at positions [Length(layer), Length(layer)+n).
  // k, v: [n][num_kv_heads][head_dim], row-major f32.
  virtual absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) = 0;

  // Causal attention of the `n` most recently appended positions of `layer` over every live
  // cached position of that layer (evicted positions are skipped), in position order.
  // q, out: [n][num_q_heads][head_dim]. When `position_mass` is not null it receives, for each
  // cached position p < Length(layer), the softmax weight summed over query heads and over the n
  // queries (0 for evicted positions): the raw material of cumulative scoring.
  virtual absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                              float* position_mass) = 0;

  // Threads later Attend calls may split their work over (not owned; null = the calling thread
  // only). Results do not depend on it. A cache may ignore it.
  virtual void SetTaskRunner(kernels::TaskRunner* runner) { (void)runner; }
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_ATTENTION_CACHE_H_
