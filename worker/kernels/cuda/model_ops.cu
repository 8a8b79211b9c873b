// Kernels of the synthetic GPU decoder. See model_ops.h.

#include <cuda_bf16.h>

#include <cmath>

#include "worker/kernels/cuda/device_utils.cuh"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// SplitMix64 finaliser: a good 64-bit mix of a counter.
__device__ inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint32_t GridFor(uint64_t n) {
  const uint64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<uint32_t>(blocks < 65536 * 16 ? blocks : 65536 * 16);
}

__global__ void FillHashKernel(__nv_bfloat16* dst, uint64_t n, uint64_t seed, float scale) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = Mix(seed * 0x9E3779B97F4A7C15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.f / 8388608.f) - 1.f;  // [-1, 1)
    dst[i] = __float2bfloat16_rn(scale * u);
  }
}

__global__ void FillHashF32Kernel(float* dst, uint64_t n, uint64_t seed, float scale) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = Mix(seed * 0x9E3779B97F4A7C15ull + i);
    dst[i] = scale * (static_cast<float>(h >> 40) * (1.f / 8388608.f) - 1.f);
  }
}

__global__ void FillConstKernel(__nv_bfloat16* dst, uint64_t n, float value) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2bfloat16_rn(value);
  }
}

__global__ void EmbedKernel(const __nv_bfloat16* table, const int32_t* tokens, uint32_t hidden,
                            float* x) {
  const uint32_t b = blockIdx.y;
  const __nv_bfloat16* row = table + uint64_t(tokens[b]) * hidden;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden;
       i += gridDim.x * blockDim.x) {
    x[uint64_t{b} * hidden + i] = __bfloat162float(row[i]);
  }
}

// One CTA per row: fixed-order block reduction of the sum of squares.
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const float* x, const __nv_bfloat16* w, uint32_t n, float eps,
                  __nv_bfloat16* out) {
  __shared__ float partial[kThreads / 32];
  const float* row = x + uint64_t{blockIdx.x} * n;
  float ss = 0.f;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) ss = fmaf(row[i], row[i], ss);
  ss = WarpSum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  const float inv = rsqrtf(total / n + eps);
  __nv_bfloat16* o = out + uint64_t{blockIdx.x} * n;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    o[i] = __float2bfloat16_rn(row[i] * inv * __bfloat162float(w[i]));
  }
}

// K row of sequence b's new token in the layer's page block.
__device__ inline __nv_bfloat16* TokenRow(const RopeAppendParams& p, uint32_t b) {
  const uint32_t pos = p.positions[b];
  void* page = p.pages[p.page_indptr[b] + pos / p.page_tokens];
  return static_cast<__nv_bfloat16*>(page) +
         uint64_t{pos % p.page_tokens} * p.num_kv_heads * p.head_dim;
}

// grid (heads_total, batch), head_dim / 2 threads: thread j rotates the pair (j, j + hd/2).
__global__ void RopeAppendKernel(RopeAppendParams p) {
  const uint32_t h = blockIdx.x, b = blockIdx.y, j = threadIdx.x;
  const uint32_t half = p.head_dim / 2;
  const uint32_t row_elems = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
  const float* src = p.qkv + uint64_t{b} * row_elems + uint64_t{h} * p.head_dim;
  const float pos = static_cast<float>(p.positions[b]);
  const float freq = powf(p.rope_base, -2.f * static_cast<float>(j) / p.head_dim);
  float sn, cs;
  sincosf(pos * freq, &sn, &cs);
  const float a = src[j], c = src[j + half];
  const float ra = a * cs - c * sn, rc = c * cs + a * sn;
  const uint32_t qh = p.num_q_heads, kvh = p.num_kv_heads;
  if (h < qh) {
    float* q = p.q_out + (uint64_t{b} * qh + h) * p.head_dim;
    q[j] = ra;
    q[j + half] = rc;
  } else if (p.k_out != nullptr) {  // f32 rows for a cache that appends them itself
    const bool key = h < qh + kvh;
    float* row = (key ? p.k_out : p.v_out) +
                 (uint64_t{b} * kvh + (key ? h - qh : h - qh - kvh)) * p.head_dim;
    row[j] = key ? ra : a;
    row[j + half] = key ? rc : c;
  } else if (h < qh + kvh) {
    __nv_bfloat16* k = TokenRow(p, b) + uint64_t(h - qh) * p.head_dim;
    k[j] = __float2bfloat16_rn(ra);
    k[j + half] = __float2bfloat16_rn(rc);
  } else {
    __nv_bfloat16* v = TokenRow(p, b) + uint64_t{p.page_tokens} * kvh * p.head_dim +
                       uint64_t(h - qh - kvh) * p.head_dim;
    v[j] = __float2bfloat16_rn(a);
    v[j + half] = __float2bfloat16_rn(c);
  }
}

__global__ void AdvanceKernel(int32_t* positions, int32_t* lengths, uint32_t batch) {
  const uint32_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < batch) {
    positions[b] += 1;
    if (lengths != nullptr) lengths[b] = positions[b] + 1;
  }
}

__global__ void SwiGluKernel(const float* gu, uint32_t ffn, __nv_bfloat16* out) {
  const uint32_t b = blockIdx.y;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < ffn; i += gridDim.x * blockDim.x) {
    const float g = gu[uint64_t{b} * 2 * ffn + i], u = gu[uint64_t{b} * 2 * ffn + ffn + i];
    out[uint64_t{b} * ffn + i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
  }
}

__global__ void AddKernel(float* x, const float* y, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void CastKernel(const float* src, uint64_t n, __nv_bfloat16* dst) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

// One CTA per row; ties resolve to the lowest index.
__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* logits, uint32_t vocab, int32_t* out) {
  __shared__ float best_v[kThreads];
  __shared__ int32_t best_i[kThreads];
  const float* row = logits + uint64_t{blockIdx.x} * vocab;
  float v = -INFINITY;
  int32_t idx = 0;
  for (uint32_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (row[i] > v) v = row[i], idx = static_cast<int32_t>(i);
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int32_t oi = best_i[threadIdx.x + s];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}

}  // namespace

cudaError_t FillHashBf16(uint16_t* dst, uint64_t n, uint64_t seed, float scale,
                         cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillHashKernel<<<GridFor(n), kThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dst), n,
                                                      seed, scale);
  return cudaGetLastError();
}

cudaError_t FillHashF32(float* dst, uint64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillHashF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(dst, n, seed, scale);
  return cudaGetLastError();
}

cudaError_t FillConstBf16(uint16_t* dst, uint64_t n, float value, cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillConstKernel<<<GridFor(n), kThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dst), n,
                                                       value);
  return cudaGetLastError();
}

cudaError_t EmbedTokens(const uint16_t* table, const int32_t* tokens, uint32_t batch,
                        uint32_t hidden, float* x, cudaStream_t stream) {
  if (table == nullptr || tokens == nullptr || x == nullptr || batch == 0 || hidden == 0 ||
      batch > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((hidden + kThreads - 1) / kThreads, batch);
  EmbedKernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(table), tokens,
                                             hidden, x);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const uint16_t* weight, uint32_t rows, uint32_t n, float eps,
                    uint16_t* out, cudaStream_t stream) {
  if (x == nullptr || weight == nullptr || out == nullptr || rows == 0 || n == 0 || !(eps > 0.f)) {
    return cudaErrorInvalidValue;
  }
  RmsNormKernel<<<rows, kThreads, 0, stream>>>(x, reinterpret_cast<const __nv_bfloat16*>(weight), n,
                                               eps, reinterpret_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t RopeAppend(const RopeAppendParams& p, cudaStream_t stream) {
  if (!ValidRopeAppend(p)) return cudaErrorInvalidValue;
  const dim3 grid(p.num_q_heads + 2 * p.num_kv_heads, p.batch);
  RopeAppendKernel<<<grid, p.head_dim / 2, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t SwiGlu(const float* gu, uint32_t batch, uint32_t ffn, uint16_t* out,
                   cudaStream_t stream) {
  if (gu == nullptr || out == nullptr || batch == 0 || batch > 65535 || ffn == 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((ffn + kThreads - 1) / kThreads, batch);
  SwiGluKernel<<<grid, kThreads, 0, stream>>>(gu, ffn, reinterpret_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t AddInPlace(float* x, const float* y, uint64_t n, cudaStream_t stream) {
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t CastF32ToBf16(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream) {
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  CastKernel<<<GridFor(n), kThreads, 0, stream>>>(src, n, reinterpret_cast<__nv_bfloat16*>(dst));
  return cudaGetLastError();
}

cudaError_t AdvancePositions(int32_t* positions, int32_t* lengths, uint32_t batch,
                             cudaStream_t stream) {
  if (positions == nullptr || batch == 0) return cudaErrorInvalidValue;
  AdvanceKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(positions, lengths,
                                                                            batch);
  return cudaGetLastError();
}

cudaError_t ArgmaxRows(const float* logits, uint32_t rows, uint32_t vocab, int32_t* out,
                       cudaStream_t stream) {
  if (logits == nullptr || out == nullptr || rows == 0 || vocab == 0) return cudaErrorInvalidValue;
  ArgmaxKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

}  // namespace kvtier::worker::kernels::cuda
