// llama_kernels.h's launchers on the simulated device: each kernel's per-element rule as a loop
// (f16 rounding by engine/quant.h's Fp32ToFp16, round to nearest even like __float2half_rn).

#include <cmath>

#include "engine/cuda/llama_kernels.h"
#include "engine/quant.h"
#include "worker/cuda/sim/kernel.h"

namespace kvtier::engine::cuda {
namespace {

using cudasim::Touch;

}  // namespace

cudaError_t EmbedHalf(const uint16_t* table, const int32_t* tokens, uint32_t count, uint32_t hidden,
                      float* x, cudaStream_t stream) {
  if (count == 0 || hidden == 0) return cudaSuccess;
  return cudasim::Launch(stream, "EmbedHalf", [=] {
    if (!Touch(tokens, uint64_t{count} * 4, "tokens") ||
        !Touch(x, uint64_t{count} * hidden * 4, "x")) {
      return;
    }
    for (uint32_t t = 0; t < count; ++t) {
      const uint16_t* row = table + uint64_t(tokens[t]) * hidden;
      if (!Touch(row, uint64_t{hidden} * 2, "table row")) return;
      for (uint32_t c = 0; c < hidden; ++c) x[uint64_t{t} * hidden + c] = Fp16ToFp32(row[c]);
    }
  });
}

cudaError_t RmsNormHalf(const float* x, const float* weight, uint32_t rows, uint32_t n, float eps,
                        uint16_t* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "RmsNormHalf", [=] {
    const uint64_t all = uint64_t{rows} * n;
    if (!Touch(x, all * 4, "x") || !Touch(weight, uint64_t{n} * 4, "weight") ||
        !Touch(out, all * 2, "out")) {
      return;
    }
    for (uint32_t r = 0; r < rows; ++r) {
      const float* row = x + uint64_t{r} * n;
      double ss = 0;
      for (uint32_t i = 0; i < n; ++i) ss += double(row[i]) * row[i];
      const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
      for (uint32_t i = 0; i < n; ++i) {
        out[uint64_t{r} * n + i] = Fp32ToFp16(row[i] * scale * weight[i]);
      }
    }
  });
}

cudaError_t SplitRope(const SplitRopeParams& p, cudaStream_t stream) {
  if (p.head_dim % 2 != 0) return cudaErrorInvalidValue;
  const uint64_t pairs = uint64_t{p.num_q_heads + 2 * p.num_kv_heads} * p.head_dim / 2;
  if (p.tokens == 0 || pairs == 0) return cudaSuccess;
  return cudasim::Launch(stream, "SplitRope", [p, pairs] {
    const uint32_t hd = p.head_dim, half = hd / 2;
    const uint32_t qd = p.num_q_heads * hd, kvd = p.num_kv_heads * hd;
    const uint64_t t_all = p.tokens;
    if (!Touch(p.qkv, t_all * (qd + 2 * kvd) * 4, "qkv") ||
        !Touch(p.positions, t_all * 4, "positions") ||
        !Touch(p.inv_freq, uint64_t{half} * 8, "inv_freq") || !Touch(p.q, t_all * qd * 4, "q") ||
        !Touch(p.k, t_all * kvd * 4, "k") || !Touch(p.v, t_all * kvd * 4, "v")) {
      return;
    }
    for (uint64_t t = 0; t < t_all; ++t) {
      const float* row = p.qkv + t * (qd + 2 * kvd);
      for (uint32_t j = 0; j < pairs; ++j) {
        const uint32_t col = 2 * j;
        const float a = row[col], b = row[col + 1];
        if (col >= qd + kvd) {
          float* v = p.v + t * kvd + (col - qd - kvd);
          v[0] = a;
          v[1] = b;
          continue;
        }
        const double theta = double(p.positions[t]) * p.inv_freq[j % half];
        const float c = static_cast<float>(std::cos(theta)),
                    s = static_cast<float>(std::sin(theta));
        float* dst = col < qd ? p.q + t * qd + col : p.k + t * kvd + (col - qd);
        dst[0] = a * c - b * s;
        dst[1] = a * s + b * c;
      }
    }
  });
}

cudaError_t SwiGluHalf(const float* gu, uint32_t rows, uint32_t ffn, uint16_t* out,
                       cudaStream_t stream) {
  if (rows == 0 || ffn == 0) return cudaSuccess;
  return cudasim::Launch(stream, "SwiGluHalf", [=] {
    if (!Touch(gu, uint64_t{rows} * 2 * ffn * 4, "gu") ||
        !Touch(out, uint64_t{rows} * ffn * 2, "out")) {
      return;
    }
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < ffn; ++c) {
        const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
        out[r * ffn + c] = Fp32ToFp16(g / (1.f + std::exp(-g)) * u);
      }
    }
  });
}

cudaError_t CastHalf(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "CastHalf", [=] {
    if (!Touch(src, n * 4, "src") || !Touch(dst, n * 2, "dst")) return;
    for (uint64_t i = 0; i < n; ++i) dst[i] = Fp32ToFp16(src[i]);
  });
}

}  // namespace kvtier::engine::cuda
