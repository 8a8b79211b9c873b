#ifndef KVTIER_TESTS_SUPPORT_LOSSLESS_RUNTIME_H_
#define KVTIER_TESTS_SUPPORT_LOSSLESS_RUNTIME_H_

// The small model shape and lossless sequence options the runtime-through-kvtierd tests share:
// a short window and Δ, so the policy moves pages within a test-sized chain.

#include "worker/runtime/worker_runtime.h"

namespace kvtier::testing {

inline worker::AttentionShape SmallShape() {
  return {.num_layers = 4, .num_q_heads = 6, .num_kv_heads = 2, .head_dim = 32, .scale = 0};
}

// `full` at beta >= 1, otherwise hierarchy at hbm_ratio beta; r = 0, gamma = 0.
inline worker::SequenceOptions Lossless(double beta) {
  worker::SequenceOptions o;
  o.policy = beta >= 1 ? "full" : "hierarchy";
  o.prompt_tokens = 24;
  o.tiering.window_tokens = 32;
  o.tiering.retier_interval = 16;
  o.tiering.budgets = {.evict_ratio = 0, .hbm_ratio = beta, .compress_ratio = 0};
  return o;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_LOSSLESS_RUNTIME_H_
