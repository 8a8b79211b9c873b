#ifndef KVTIER_CORE_TIERING_RKV_H_
#define KVTIER_CORE_TIERING_RKV_H_

// R-KV, redundancy-aware KV compression for reasoning models (Cai et al., 2025), faithful to the
// paper's decoding-time algorithm. Runs in the worker: it needs attention rows and key vectors.
// Pure; thread-compatible.
//
// Per layer and kv head, over the positions still kept (the compressed cache):
//   importance(j) = mean over the last α queries of their attention to j, renormalised over
//                   the non-window positions (R-KV softmaxes the logits of [:-α] only), then
//                   max-pooled with width 7 (stride 1, padding 3) along the cache, and averaged
//                   over the kv head's query heads (GQA);
//   redundancy(j) = softmax over the cache of mean_i sim(i, j), sim = key cosine similarity
//                   with a zero diagonal, where for each row i the most recent j with
//                   sim(i, j) > 0.5 is zeroed first (so the most recent near-duplicate of a token
//                   is not counted as redundant: it is the copy that is kept);
//   score(j)      = λ·importance(j) − (1 − λ)·redundancy(j).
// The last α positions are always kept; the other candidates keep the top
// budget − (kept protected) scores. Compression runs whenever a head's cache reaches
// budget + buffer (decoding appends to a 128-token buffer; every 128 steps the cache goes back to
// the budget).
// Published defaults: α = 8, pool width 7, threshold 0.5, buffer 128, λ = 0.1 (the paper; the
// reference code used 0.07). The cache budget is the experiment's knob (the paper: 128…4096).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/keep_mask.h"

namespace kvtier::tiering {

struct RkvConfig {
  uint64_t budget_tokens = 1024;  // kept per (layer, kv head) after a compression
  uint64_t buffer_tokens = 128;
  uint32_t alpha = 8;       // observation window: the last α queries, always kept
  uint32_t pool_width = 7;  // odd
  double lambda = 0.1;      // paper value; the reference code used 0.07
  double similarity_threshold = 0.5;
  bool protect_prompt = false;  // R-KV compresses the whole cache

  // INVALID_ARGUMENT naming the field: lambda outside [0, 1], even or zero pool_width,
  // alpha 0, budget_tokens below alpha.
  absl::Status Validate() const;
};

struct RkvInput {
  uint32_t num_layers = 0;
  uint32_t num_q_heads = 0;  // multiple of num_kv_heads
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t prompt_tokens = 0;
  uint64_t length = 0;   // positions [0, length)
  uint32_t queries = 0;  // rows given: min(α, length), the queries at length−queries…length−1
  // [num_layers][num_q_heads][queries][length]: softmax attention rows of the last queries.
  // Only the kept positions are read.
  absl::Span<const float> attention;
  // [num_layers][num_kv_heads][length][head_dim]: key vectors. Only kept positions are read.
  absl::Span<const float> keys;
};

// True when some (layer, kv head) keeps at least budget + buffer positions.
bool RkvDue(const KeepMask& mask, const RkvConfig& config);

// Compresses every (layer, kv head) keeping more than budget_tokens back to budget_tokens (or
// to its protected positions if those alone exceed it). `current` may be shorter than
// input.length (new positions are kept). Evicted positions stay evicted.
// INVALID_ARGUMENT naming the field for wrong sizes, non-finite attention or keys at kept
// positions, or an invalid config.
absl::StatusOr<KeepMask> RkvCompress(const RkvInput& input, const KeepMask& current,
                                     const RkvConfig& config);

// The R-KV scores of one (layer, kv head) over `kept` positions (ascending), as above; exposed
// for tests. Protected positions get scores too (callers ignore them).
// REQUIRES: input validated by RkvCompress's checks.
std::vector<double> RkvScores(const RkvInput& input, uint32_t layer, uint32_t kv_head,
                              absl::Span<const uint64_t> kept, const RkvConfig& config);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_RKV_H_
