#ifndef KVTIER_WORKER_KERNELS_ATTENTION_CPU_H_
#define KVTIER_WORKER_KERNELS_ATTENTION_CPU_H_

// CPU attention over a paged KV cache, FlashInfer-style: raw pointers and one Params struct,
// no framework headers. Thread-safe (no state); the caller owns every buffer.
//
// Determinism contract (what makes T0/T1 splits bit-exact): for a given Isa the result depends
// only on the VALUES behind the row pointers, never on where the rows live, how they are
// grouped into pages or how they are aligned. Scores are kept in a position-indexed scratch
// array, reductions over positions run in position order in fixed-width vector lanes, and the
// output accumulates position by position.
//
// Threads (AttentionParams::runner): a query's positions are attended in spans of 256 fixed from
// position 0 (each span's scores, softmax numerators against its own max and value sum computed
// alone), merged in span order by log-sum-exp, then each span's numerators are scaled into the
// weights position_mass sums over heads in head order. One query splits over spans, so the
// result is bit-identical whatever the runner and its thread count. Several queries (prefill)
// run in fixed blocks of queries, each block serially with its own position_mass partial;
// partials are added in block order, so position_mass does not depend on the thread count
// either (it may differ from a one-block sum in the last bits).

#include <cstddef>
#include <cstdint>

#include "worker/kernels/task_runner.h"

namespace kvtier::worker::kernels {

struct AttentionParams {
  // [num_queries][num_q_heads][head_dim]; query t sits at position length - num_queries + t and
  // attends causally to positions [0, that position].
  const float* q = nullptr;
  // Floats between consecutive queries and between the heads of one query (0: dense, as above),
  // so that a [num_q_heads][num_queries][head_dim] view (transformers' layout) needs no copy.
  // A head's head_dim values are contiguous. The result does not depend on them.
  size_t q_token_stride = 0;
  size_t q_head_stride = 0;
  // [num_queries][num_q_heads][head_dim], overwritten.
  float* out = nullptr;
  // [length] or null. Overwritten with the softmax weight of each position summed over query
  // heads and queries; 0 for evicted and masked positions.
  float* position_mass = nullptr;
  // [length] each: the K (V) row of position p, laid out [num_kv_heads][head_dim]; null where the
  // position is evicted (k and v null together). Rows need no particular alignment.
  const float* const* k_rows = nullptr;
  const float* const* v_rows = nullptr;
  // Null, or [num_kv_heads] arrays of [length]: 0 masks the position for every query head that
  // reads that kv head (per-head eviction baselines such as H2O).
  const uint8_t* const* keep = nullptr;
  uint32_t length = 0;
  uint32_t num_queries = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;  // divides num_q_heads; q head h reads kv head h / group
  uint32_t head_dim = 0;
  float scale = 0.f;
  // 0, or a sliding window: the query at position P attends only positions > P − window
  // (transformers' sliding_window; Mistral, Gemma-2's sliding layers).
  uint32_t window = 0;
  // 0, or attention logit softcapping: each live score s becomes softcap · tanh(s / softcap)
  // before the softmax (Gemma-2); position_mass and lse are of the capped scores.
  float softcap = 0.f;
  // Null, or [num_queries][num_q_heads]: log Σ exp(scale · q·k) over the live positions this
  // call attended (-inf where none), so that partials over disjoint position sets merge exactly
  // (MergeAttentionPartials: split attention over DDR).
  float* lse = nullptr;
  // Null, or [num_q_heads][length] (REQUIRES num_queries == 1): each head's softmax weights,
  // position_mass before its sum over heads — what a merge rescales head by head.
  float* head_mass = nullptr;
  // AttentionScratchFloats(num_q_heads, length) floats, 32-byte alignment not required.
  float* scratch = nullptr;
  // Null = the calling thread alone. The result does not depend on it (see the top comment).
  TaskRunner* runner = nullptr;
};

enum class Isa : uint8_t { kPortable = 0, kAvx2Fma = 1 };

// Floats of scratch Attention needs.
size_t AttentionScratchFloats(uint32_t num_q_heads, uint32_t length);

// The best ISA this CPU runs (AVX2+FMA when present).
Isa BestIsa();
// True when `isa` can run here for this head_dim (AVX2 needs head_dim % 8 == 0).
bool IsaUsable(Isa isa, uint32_t head_dim);

// REQUIRES: num_queries <= length, shapes consistent, IsaUsable(isa, head_dim).
// A query whose every position is evicted or masked gets a zero output.
void Attention(const AttentionParams& p, Isa isa);
// Attention with BestIsa() where usable, otherwise portable.
void Attention(const AttentionParams& p);

}  // namespace kvtier::worker::kernels

#endif  // KVTIER_WORKER_KERNELS_ATTENTION_CPU_H_
