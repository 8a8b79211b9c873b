#ifndef KVTIER_WORKER_KERNELS_CUDA_PAGED_ATTENTION_H_
#define KVTIER_WORKER_KERNELS_CUDA_PAGED_ATTENTION_H_

// Paged decode attention on the GPU, FlashInfer-style: raw device pointers, one Params struct,
// no framework headers. The host launcher validates, dispatches head_dim (64, 128) and the KV
// element type to compile-time constants, and returns a cudaError_t (cudaErrorInvalidValue for
// bad shapes, with nothing launched).
//
// Pages are reached only through a page table, so a page in the device arena (T0) and a T1 page
// staged from host memory are read by the same instructions in the same order. The reduction
// order depends only on positions: positions are cut into fixed chunks of kAttentionChunk, each
// chunk is reduced in position order, and chunks are merged in chunk order. That is what makes
// `full` and `hierarchy` bit-identical on the GPU whatever the T0/T1 split.

#include <cstdint>

#include "worker/cuda/cuda_api.h"
#include "worker/kernels/cuda/dtype.h"

namespace kvtier::worker::kernels::cuda {

// Positions reduced by one CTA (a fixed constant: never derived from the placement).
inline constexpr uint32_t kAttentionChunk = 64;
// Largest query-head group per KV head (num_q_heads / num_kv_heads).
inline constexpr uint32_t kMaxGqaGroup = 8;

struct PagedDecodeParams {
  // [batch][num_q_heads][head_dim] f32: one decode query per sequence, at position
  // lengths[b] - 1 (it attends to [0, lengths[b])).
  const float* q = nullptr;
  // [batch][num_q_heads][head_dim] f32, overwritten.
  float* out = nullptr;
  // Page table. Sequence b owns entries [page_indptr[b], page_indptr[b+1]); entry i of sequence b
  // covers positions [i * page_tokens, (i+1) * page_tokens). Each entry points to one layer's
  // block of one page: K [page_tokens][num_kv_heads][head_dim] immediately followed by V of the
  // same shape, elements of `kv_dtype`. A null entry is an evicted page: its positions get no
  // attention and zero mass. Entries point into the T0 arena or into a staging buffer alike.
  const void* const* pages = nullptr;
  const int32_t* page_indptr = nullptr;  // [batch + 1], device
  const int32_t* lengths = nullptr;      // [batch], device; lengths[b] <= pages of b * page_tokens
  // Null, or [batch] rows of `mass_stride` floats: for p < lengths[b], the softmax weight of
  // position p summed over query heads (0 for evicted positions). Positions >= lengths[b] are
  // left untouched. With accumulate_mass the mass is added to what is there (summing layers).
  float* position_mass = nullptr;
  uint32_t mass_stride = 0;
  bool accumulate_mass = false;
  // Split attention (a partial merged later with MergeSplitAttention). Null, or [batch]
  // [num_q_heads]: log Σ exp(scale · q·k) over the live positions (-inf where none).
  float* lse = nullptr;
  // Null, or [batch][num_q_heads] rows of `mass_stride` floats: each head's softmax weight of
  // each position p < lengths[b] (0 for evicted positions), position_mass before its sum over
  // heads.
  float* head_mass = nullptr;
  // Scratch, device, PagedDecodeWorkspaceBytes(...) bytes; no initialisation needed.
  void* workspace = nullptr;
  uint32_t batch = 0;
  uint32_t max_length = 0;  // >= every lengths[b]; sizes the grid and the workspace
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;  // divides num_q_heads; group = num_q_heads / num_kv_heads <= 8
  uint32_t head_dim = 0;      // 64 or 128
  uint32_t page_tokens = 0;
  float scale = 0.f;
  KvDtype kv_dtype = KvDtype::kBf16;
};

// Workspace bytes for these sizes.
uint64_t PagedDecodeWorkspaceBytes(uint32_t batch, uint32_t max_length, uint32_t num_q_heads,
                                   uint32_t head_dim);

// Three launches on `stream` (chunk partials, merge, mass). cudaErrorInvalidValue when a field
// is out of range (nothing is launched); otherwise the launch status.
cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream);

// The cumulative score on the device (the paper's rule, mean over heads and over layers,
// accumulated layer by layer; tiering::AccumulateDeviceMass is its CPU reference): row b of
// `mass` (a PagedDecodeParams::position_mass row, summed over query heads) adds
// mass[b][i] * weight to scores[i] for i < first_length + b, rows in order, one f32 multiply and
// one f32 add each (no fused multiply-add, so the CPU reference gives the same bits).
struct ScoreAccumulateParams {
  const float* mass = nullptr;  // [rows][mass_stride], device
  uint32_t rows = 0;
  uint32_t mass_stride = 0;   // >= first_length + rows - 1
  uint32_t first_length = 0;  // > 0
  float weight = 0.f;         // 1 / (num_q_heads × layers of the group)
  float* scores = nullptr;    // [first_length + rows - 1], device, added to
};

// One launch on `stream`; cudaErrorInvalidValue for a bad field (nothing launched).
cudaError_t AccumulateScores(const ScoreAccumulateParams& p, cudaStream_t stream);

// Split attention of one decode query: the device's partial (PagedDecodeAttention over T0 and
// staged pages, with lse and head_mass) and the host's partial (the CPU kernel over the pages a
// schedule leaves in place, uploaded) merged by log-sum-exp, as MergeAttentionPartials
// (worker/kernels/attention_merge.h) merges them on the CPU: per head, with L = log(e^a + e^b)
// of the two lse, out = w_a · out_a + w_b · out_b (w_i = exp(lse_i − L), parts in that order,
// each term one f32 multiply and one f32 add), and the mass of position p = Σ_h (w_a · mass_a
// + w_b · mass_b)[h][p], heads in order. A head that no part attended gets zero output and
// weights. Every pointer is device memory.
struct SplitMergeParams {
  const float* out[2] = {nullptr, nullptr};        // [num_q_heads][head_dim] each
  const float* lse[2] = {nullptr, nullptr};        // [num_q_heads] each
  const float* head_mass[2] = {nullptr, nullptr};  // [num_q_heads][mass_stride] each, or null
  float* merged = nullptr;                         // [num_q_heads][head_dim]
  float* position_mass = nullptr;                  // [length], or null (then head_mass is not read)
  uint32_t num_q_heads = 0;
  uint32_t head_dim = 0;
  uint32_t length = 0;
  uint32_t mass_stride = 0;  // >= length
};

// Two launches on `stream` (outputs, mass); cudaErrorInvalidValue for a bad field.
cudaError_t MergeSplitAttention(const SplitMergeParams& p, cudaStream_t stream);
// The same rule for the rows of one attention launch bound for several sequences' scores: row
// b adds mass[b][i] * weight to scores[b][i] for i < lengths[b]. Rows naming the same scores
// must be consecutive (one sequence's queries, lengths growing by one: a prefill); they are
// added in row order, so each sequence's scores get the bits AccumulateScores gives them.
struct ScoreBatchParams {
  const float* mass = nullptr;  // [rows][mass_stride], device
  uint32_t rows = 0;
  uint32_t mass_stride = 0;          // >= max_length
  uint32_t max_length = 0;           // >= every lengths[b] (sizes the grid)
  const int32_t* lengths = nullptr;  // [rows], device, each in [1, max_length]
  float* const* scores = nullptr;    // [rows] device pointers, added to ([lengths[b]] each)
  float weight = 0.f;
};

// One launch on `stream` for every row; cudaErrorInvalidValue for a bad field (nothing
// launched).
cudaError_t AccumulateScoresBatch(const ScoreBatchParams& p, cudaStream_t stream);

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_PAGED_ATTENTION_H_
