#ifndef KVTIER_CORE_TIERING_SNAPKV_H_
#define KVTIER_CORE_TIERING_SNAPKV_H_

// SnapKV-style prompt compression (Li et al., 2024): the queries of an observation window at
// the end of the prompt vote for the prompt positions they attend to; votes are pooled over
// neighbouring positions (a 1-D max pool) so that a kept position brings its context along;
// per (layer, kv head) the top positions by pooled vote are kept together with the window,
// the rest evicted once, at prefill end. Positions written later are kept. Pure.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/keep_mask.h"

namespace kvtier::tiering {

struct SnapKvConfig {
  uint32_t window = 32;        // observation window: the last prompt queries
  uint32_t pool_kernel = 7;    // max-pool width over positions (odd)
  uint64_t budget_tokens = 0;  // kept positions per (layer, kv head), window included
};

struct SnapKvInput {
  uint32_t num_layers = 0;
  uint32_t num_q_heads = 0;  // multiple of num_kv_heads
  uint32_t num_kv_heads = 0;
  uint64_t length = 0;   // positions [0, length)
  uint32_t queries = 0;  // rows given: the queries at length − queries … length − 1
  // [num_layers][num_q_heads][queries][length]: softmax attention rows.
  absl::Span<const float> attention;
};

// The keep mask over [0, length). Every (layer, kv head) keeps min(length, max(budget, queries))
// positions: the last `queries` positions and the best-voted others. INVALID_ARGUMENT naming the
// field for a shape that does not match attention.size(), zero heads, or q heads not a multiple
// of kv heads.
absl::StatusOr<KeepMask> SnapKvSelect(const SnapKvInput& in, const SnapKvConfig& config);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_SNAPKV_H_
