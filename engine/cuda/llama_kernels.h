#ifndef KVTIER_ENGINE_CUDA_LLAMA_KERNELS_H_
#define KVTIER_ENGINE_CUDA_LLAMA_KERNELS_H_

// The row and element-wise kernels of the CUDA reference engine (the GEMMs are cuBLAS): f16
// embedding lookup, RMSNorm to f16, the Q|K|V split with adjacent-pair RoPE, SwiGLU and a cast.
// Raw device pointers; f16 values are uint16_t bits so host code needs no CUDA type. Launchers
// enqueue on `stream`, never synchronize, and return the launch error. Each kernel computes the
// same value for a row whatever the other rows are (batched rows equal single ones).

#include <cstdint>

#include "worker/cuda/cuda_api.h"

namespace kvtier::engine::cuda {

// x[t][:] = f32(table[tokens[t]][:]); table [vocab][hidden] f16, tokens [count].
cudaError_t EmbedHalf(const uint16_t* table, const int32_t* tokens, uint32_t count, uint32_t hidden,
                      float* x, cudaStream_t stream);

// out[r][i] = f16(x[r][i] * s_r * weight[i]), s_r = 1/sqrt(Σ x[r]² / n + eps) with the sum in
// double (as the CPU engine). x [rows][n] f32, weight [n] f32.
cudaError_t RmsNormHalf(const float* x, const float* weight, uint32_t rows, uint32_t n, float eps,
                        uint16_t* out, cudaStream_t stream);

struct SplitRopeParams {
  const float* qkv = nullptr;          // [tokens][(q_heads + 2 kv_heads) * head_dim]: Q | K | V
  const int32_t* positions = nullptr;  // [tokens]
  const double* inv_freq = nullptr;    // [head_dim / 2]: base^(-2i / head_dim)
  float* q = nullptr;                  // [tokens][q_heads][head_dim], rotated
  float* k = nullptr;                  // [tokens][kv_heads][head_dim], rotated
  float* v = nullptr;                  // [tokens][kv_heads][head_dim]
  uint32_t tokens = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;  // even
};

// Splits the fused projection and rotates Q and K with adjacent-pair ("normal", GGUF llama)
// RoPE: (x[2i], x[2i+1]) of every head by pos · inv_freq[i], cos/sin in double.
cudaError_t SplitRope(const SplitRopeParams& p, cudaStream_t stream);

// out[r][i] = f16(silu(gu[r][i]) * gu[r][ffn + i]); gu [rows][2 ffn] f32 (gate | up).
cudaError_t SwiGluHalf(const float* gu, uint32_t rows, uint32_t ffn, uint16_t* out,
                       cudaStream_t stream);

// dst[i] = f16(src[i]), round to nearest even.
cudaError_t CastHalf(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream);

}  // namespace kvtier::engine::cuda

#endif  // KVTIER_ENGINE_CUDA_LLAMA_KERNELS_H_
