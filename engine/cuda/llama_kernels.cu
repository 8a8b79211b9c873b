#include <cuda_fp16.h>

#include "engine/cuda/llama_kernels.h"

namespace kvtier::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

unsigned Blocks(uint64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ uint16_t ToHalfBits(float f) { return __half_as_ushort(__float2half_rn(f)); }

__global__ void EmbedKernel(const uint16_t* table, const int32_t* tokens, uint32_t count,
                            uint32_t hidden, float* x) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i >= uint64_t{count} * hidden) return;
  const uint64_t t = i / hidden, c = i % hidden;
  x[i] = __half2float(__ushort_as_half(table[uint64_t(tokens[t]) * hidden + c]));
}

// One block per row; the sum of squares in double, reduced in shared memory.
__global__ void RmsNormKernel(const float* x, const float* w, uint32_t n, float eps,
                              uint16_t* out) {
  __shared__ double partial[kThreads];
  const float* row = x + uint64_t{blockIdx.x} * n;
  double ss = 0;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(row[i]) * row[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = static_cast<float>(1.0 / sqrt(partial[0] / n + eps));
  uint16_t* o = out + uint64_t{blockIdx.x} * n;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = ToHalfBits(row[i] * scale * w[i]);
}

// One thread per pair of adjacent values of a token's fused Q|K|V row.
__global__ void SplitRopeKernel(SplitRopeParams p) {
  const uint32_t hd = p.head_dim, half = hd / 2;
  const uint32_t qd = p.num_q_heads * hd, kvd = p.num_kv_heads * hd;
  const uint32_t pairs = (qd + 2 * kvd) / 2;
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i >= uint64_t{p.tokens} * pairs) return;
  const uint64_t t = i / pairs;
  const uint32_t j = static_cast<uint32_t>(i % pairs), col = 2 * j;
  const float* row = p.qkv + t * (qd + 2 * kvd);
  const float a = row[col], b = row[col + 1];
  if (col >= qd + kvd) {
    float* v = p.v + t * kvd + (col - qd - kvd);
    v[0] = a;
    v[1] = b;
    return;
  }
  const double theta = double(p.positions[t]) * p.inv_freq[j % half];
  const float c = static_cast<float>(cos(theta)), s = static_cast<float>(sin(theta));
  float* dst = col < qd ? p.q + t * qd + col : p.k + t * kvd + (col - qd);
  dst[0] = a * c - b * s;
  dst[1] = a * s + b * c;
}

__global__ void SwiGluKernel(const float* gu, uint32_t rows, uint32_t ffn, uint16_t* out) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i >= uint64_t{rows} * ffn) return;
  const uint64_t r = i / ffn, c = i % ffn;
  const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
  out[i] = ToHalfBits(g / (1.f + expf(-g)) * u);
}

__global__ void CastKernel(const float* src, uint64_t n, uint16_t* dst) {
  const uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (i < n) dst[i] = ToHalfBits(src[i]);
}

}  // namespace

cudaError_t EmbedHalf(const uint16_t* table, const int32_t* tokens, uint32_t count, uint32_t hidden,
                      float* x, cudaStream_t stream) {
  if (count == 0 || hidden == 0) return cudaSuccess;
  EmbedKernel<<<Blocks(uint64_t{count} * hidden), kThreads, 0, stream>>>(table, tokens, count,
                                                                         hidden, x);
  return cudaGetLastError();
}

cudaError_t RmsNormHalf(const float* x, const float* weight, uint32_t rows, uint32_t n, float eps,
                        uint16_t* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  RmsNormKernel<<<rows, kThreads, 0, stream>>>(x, weight, n, eps, out);
  return cudaGetLastError();
}

cudaError_t SplitRope(const SplitRopeParams& p, cudaStream_t stream) {
  if (p.head_dim % 2 != 0) return cudaErrorInvalidValue;
  const uint64_t pairs = uint64_t{p.num_q_heads + 2 * p.num_kv_heads} * p.head_dim / 2;
  if (p.tokens == 0 || pairs == 0) return cudaSuccess;
  SplitRopeKernel<<<Blocks(p.tokens * pairs), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t SwiGluHalf(const float* gu, uint32_t rows, uint32_t ffn, uint16_t* out,
                       cudaStream_t stream) {
  if (rows == 0 || ffn == 0) return cudaSuccess;
  SwiGluKernel<<<Blocks(uint64_t{rows} * ffn), kThreads, 0, stream>>>(gu, rows, ffn, out);
  return cudaGetLastError();
}

cudaError_t CastHalf(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<<<Blocks(n), kThreads, 0, stream>>>(src, n, dst);
  return cudaGetLastError();
}

}  // namespace kvtier::engine::cuda
