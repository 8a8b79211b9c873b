#ifndef KVTIER_WORKER_KERNELS_CUDA_MODEL_OPS_H_
#define KVTIER_WORKER_KERNELS_CUDA_MODEL_OPS_H_

// Element-wise and row kernels of the synthetic GPU decoder (the GEMMs are cuBLAS): weight
// generation by a counter hash, embedding lookup, RMSNorm, RoPE + KV append, SwiGLU, residual add,
// casts and argmax. Raw device pointers, one Params struct where a kernel has more than a few
// operands; launchers take a stream, validate and return a cudaError_t. bf16 values are stored as
// uint16_t bits in these signatures so host code needs no CUDA type.

#include <cstdint>

#include "worker/cuda/cuda_api.h"

namespace kvtier::worker::kernels::cuda {

// dst[i] = bf16(scale * u(seed, i)) for i < n, u uniform in [-1, 1) from a counter hash:
// deterministic for (seed, i), independent of the launch shape.
cudaError_t FillHashBf16(uint16_t* dst, uint64_t n, uint64_t seed, float scale,
                         cudaStream_t stream);
// dst[i] = scale * u(seed, i) in f32, the same u as FillHashBf16 (not rounded to bf16).
cudaError_t FillHashF32(float* dst, uint64_t n, uint64_t seed, float scale, cudaStream_t stream);
// dst[i] = bf16(value).
cudaError_t FillConstBf16(uint16_t* dst, uint64_t n, float value, cudaStream_t stream);

// x[b][:] = f32(table[tokens[b]][:]); table [vocab][hidden] bf16, tokens [batch] device.
cudaError_t EmbedTokens(const uint16_t* table, const int32_t* tokens, uint32_t batch,
                        uint32_t hidden, float* x, cudaStream_t stream);

// out[b][i] = bf16(x[b][i] / rms(x[b]) * weight[i]); x [rows][n] f32, weight [n] bf16.
cudaError_t RmsNorm(const float* x, const uint16_t* weight, uint32_t rows, uint32_t n, float eps,
                    uint16_t* out, cudaStream_t stream);

struct RopeAppendParams {
  // [batch][(num_q_heads + 2 * num_kv_heads) * head_dim] f32: the fused QKV projection.
  const float* qkv = nullptr;
  // [batch] device: position of the token being decoded.
  const int32_t* positions = nullptr;
  // [batch][num_q_heads][head_dim] f32: rotated queries.
  float* q_out = nullptr;
  // The layer's page table, as PagedDecodeParams has it: the token's K row goes to
  // pages[page_indptr[b] + pos / page_tokens] + (pos % page_tokens) rows ([num_kv_heads][head_dim]
  // bf16 each), its V row page_tokens rows further. That page must be in the table (not null).
  // Not read when k_out is set.
  void* const* pages = nullptr;
  const int32_t* page_indptr = nullptr;
  uint32_t page_tokens = 0;
  // Instead of the page table (both or neither): the rotated K row and the V row of sequence b
  // go to k_out / v_out + b * num_kv_heads * head_dim, f32 ([batch][num_kv_heads][head_dim]),
  // for a cache that appends rows itself (the tiered store).
  float* k_out = nullptr;
  float* v_out = nullptr;
  uint32_t batch = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;  // even
  float rope_base = 10000.f;
};

// Rotates q and k by RoPE (rotate-half, as Qwen/Llama-HF), writes q_out, and appends K and V
// (bf16) into the cache, or writes them as f32 rows to k_out / v_out.
cudaError_t RopeAppend(const RopeAppendParams& p, cudaStream_t stream);

// out[b][i] = bf16(silu(gu[b][i]) * gu[b][ffn + i]); gu [batch][2 * ffn] f32.
cudaError_t SwiGlu(const float* gu, uint32_t batch, uint32_t ffn, uint16_t* out,
                   cudaStream_t stream);

// x[i] += y[i].
cudaError_t AddInPlace(float* x, const float* y, uint64_t n, cudaStream_t stream);

// dst[i] = bf16(src[i]).
cudaError_t CastF32ToBf16(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream);

// positions[b] += 1; lengths[b] = positions[b] + 1 (the next step attends to its own token)
// unless lengths is null (a cache that keeps its own lengths).
cudaError_t AdvancePositions(int32_t* positions, int32_t* lengths, uint32_t batch,
                             cudaStream_t stream);

// out[b] = argmax over logits[b][0..vocab) (lowest index wins ties).
cudaError_t ArgmaxRows(const float* logits, uint32_t rows, uint32_t vocab, int32_t* out,
                       cudaStream_t stream);

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_MODEL_OPS_H_
