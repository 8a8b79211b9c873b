#ifndef KVTIER_WORKER_KERNELS_ATTENTION_MERGE_H_
#define KVTIER_WORKER_KERNELS_ATTENTION_MERGE_H_

// Split attention (DESIGN.md §3, issue #17): attention over a sequence's positions computed in
// parts over disjoint position sets — the pages staged next to the device, and the pages a
// schedule leaves in DDR, attended there by the CPU — and merged by log-sum-exp. Exact up to the
// rounding of one merge: out = Σ_i exp(lse_i − L) · out_i with L = log Σ_i exp(lse_i), per query
// and head. Pure; thread-compatible.

#include <cstdint>

#include "absl/types/span.h"

namespace kvtier::worker::kernels {

// One part, as Attention wrote it with AttentionParams::lse (and head_mass) set.
struct AttentionPartial {
  const float* out = nullptr;        // [num_queries][num_q_heads][head_dim]
  const float* lse = nullptr;        // [num_queries][num_q_heads]
  const float* head_mass = nullptr;  // [num_q_heads][length], or null (see below)
};

struct MergeShape {
  uint32_t num_queries = 0;
  uint32_t num_q_heads = 0;
  uint32_t head_dim = 0;
  uint32_t length = 0;
};

// out: [num_queries][num_q_heads][head_dim]; lse (optional): the merged log-sum-exp.
// position_mass (optional, REQUIRES num_queries == 1 and every part's head_mass): the whole
// attention's mass per position, summed over heads in head order as Attention sums it.
// A head that no part attended gets a zero output and lse -inf, as Attention gives.
void MergeAttentionPartials(absl::Span<const AttentionPartial> parts, const MergeShape& shape,
                            float* out, float* lse, float* position_mass);

}  // namespace kvtier::worker::kernels

#endif  // KVTIER_WORKER_KERNELS_ATTENTION_MERGE_H_
