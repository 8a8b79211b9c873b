// model_ops.h's launchers on the simulated device: each kernel's per-element rule as a loop, with
// the same argument checks. Reductions (RmsNorm's sum of squares) run in index order, not the
// GPU's block tree, so values may differ from a device in the last bits.

#include <cmath>
#include <cstring>

#include "worker/cuda/sim/kernel.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

using cudasim::Touch;

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float HashUniform(uint64_t seed, uint64_t i) {
  const uint64_t h = Mix(seed * 0x9E3779B97F4A7C15ull + i);
  return static_cast<float>(h >> 40) * (1.f / 8388608.f) - 1.f;  // [-1, 1)
}

}  // namespace

cudaError_t FillHashBf16(uint16_t* dst, uint64_t n, uint64_t seed, float scale,
                         cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "FillHashBf16", [=] {
    if (!Touch(dst, n * 2, "dst")) return;
    for (uint64_t i = 0; i < n; ++i) dst[i] = F32ToBf16Bits(scale * HashUniform(seed, i));
  });
}

cudaError_t FillHashF32(float* dst, uint64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "FillHashF32", [=] {
    if (!Touch(dst, n * 4, "dst")) return;
    for (uint64_t i = 0; i < n; ++i) dst[i] = scale * HashUniform(seed, i);
  });
}

cudaError_t FillConstBf16(uint16_t* dst, uint64_t n, float value, cudaStream_t stream) {
  if (dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "FillConstBf16", [=] {
    if (!Touch(dst, n * 2, "dst")) return;
    for (uint64_t i = 0; i < n; ++i) dst[i] = F32ToBf16Bits(value);
  });
}

cudaError_t EmbedTokens(const uint16_t* table, const int32_t* tokens, uint32_t batch,
                        uint32_t hidden, float* x, cudaStream_t stream) {
  if (table == nullptr || tokens == nullptr || x == nullptr || batch == 0 || hidden == 0 ||
      batch > 65535) {
    return cudaErrorInvalidValue;
  }
  return cudasim::Launch(stream, "EmbedTokens", [=] {
    if (!Touch(tokens, uint64_t{batch} * 4, "tokens") ||
        !Touch(x, uint64_t{batch} * hidden * 4, "x")) {
      return;
    }
    for (uint32_t b = 0; b < batch; ++b) {
      const uint16_t* row = table + uint64_t(tokens[b]) * hidden;
      if (!Touch(row, uint64_t{hidden} * 2, "table row")) return;
      for (uint32_t i = 0; i < hidden; ++i) x[uint64_t{b} * hidden + i] = Bf16BitsToF32(row[i]);
    }
  });
}

cudaError_t RmsNorm(const float* x, const uint16_t* weight, uint32_t rows, uint32_t n, float eps,
                    uint16_t* out, cudaStream_t stream) {
  if (x == nullptr || weight == nullptr || out == nullptr || rows == 0 || n == 0 || !(eps > 0.f)) {
    return cudaErrorInvalidValue;
  }
  return cudasim::Launch(stream, "RmsNorm", [=] {
    const uint64_t all = uint64_t{rows} * n;
    if (!Touch(x, all * 4, "x") || !Touch(weight, uint64_t{n} * 2, "weight") ||
        !Touch(out, all * 2, "out")) {
      return;
    }
    for (uint32_t r = 0; r < rows; ++r) {
      const float* row = x + uint64_t{r} * n;
      float ss = 0.f;
      for (uint32_t i = 0; i < n; ++i) ss = std::fma(row[i], row[i], ss);
      const float inv = 1.f / std::sqrt(ss / n + eps);
      for (uint32_t i = 0; i < n; ++i) {
        out[uint64_t{r} * n + i] = F32ToBf16Bits(row[i] * inv * Bf16BitsToF32(weight[i]));
      }
    }
  });
}

cudaError_t RopeAppend(const RopeAppendParams& p, cudaStream_t stream) {
  if (!ValidRopeAppend(p)) return cudaErrorInvalidValue;
  const bool rows = p.k_out != nullptr;
  return cudasim::Launch(stream, "RopeAppend", [p, rows] {
    const uint32_t qh = p.num_q_heads, kvh = p.num_kv_heads, hd = p.head_dim, half = hd / 2;
    const uint64_t row_elems = uint64_t{qh + 2 * kvh} * hd;
    if (!Touch(p.qkv, p.batch * row_elems * 4, "qkv") ||
        !Touch(p.positions, uint64_t{p.batch} * 4, "positions") ||
        !Touch(p.q_out, uint64_t{p.batch} * qh * hd * 4, "q_out") ||
        (rows && (!Touch(p.k_out, uint64_t{p.batch} * kvh * hd * 4, "k_out") ||
                  !Touch(p.v_out, uint64_t{p.batch} * kvh * hd * 4, "v_out")))) {
      return;
    }
    for (uint32_t b = 0; b < p.batch; ++b) {
      const uint32_t pos = static_cast<uint32_t>(p.positions[b]);
      uint16_t* token_k = nullptr;
      if (!rows) {
        bool ok = true;
        const int32_t first = cudasim::Load(p.page_indptr, b, "page_indptr", &ok);
        void* page =
            ok ? cudasim::Load(p.pages, first + pos / p.page_tokens, "pages", &ok) : nullptr;
        const uint64_t block = 2ull * p.page_tokens * kvh * hd * 2;
        if (!ok || !Touch(page, block, "KV page")) return;
        token_k = static_cast<uint16_t*>(page) + uint64_t{pos % p.page_tokens} * kvh * hd;
      }
      for (uint32_t h = 0; h < qh + 2 * kvh; ++h) {
        const float* src = p.qkv + b * row_elems + uint64_t{h} * hd;
        for (uint32_t j = 0; j < half; ++j) {
          const float freq = std::pow(p.rope_base, -2.f * static_cast<float>(j) / hd);
          const float angle = static_cast<float>(pos) * freq;
          const float sn = std::sin(angle), cs = std::cos(angle);
          const float a = src[j], c = src[j + half];
          const float ra = a * cs - c * sn, rc = c * cs + a * sn;
          const bool key = h >= qh && h < qh + kvh;
          if (h < qh) {
            float* q = p.q_out + (uint64_t{b} * qh + h) * hd;
            q[j] = ra;
            q[j + half] = rc;
          } else if (rows) {
            float* row = (key ? p.k_out : p.v_out) +
                         (uint64_t{b} * kvh + (key ? h - qh : h - qh - kvh)) * hd;
            row[j] = key ? ra : a;
            row[j + half] = key ? rc : c;
          } else {
            uint16_t* dst =
                key ? token_k + uint64_t(h - qh) * hd
                    : token_k + uint64_t{p.page_tokens} * kvh * hd + uint64_t(h - qh - kvh) * hd;
            dst[j] = F32ToBf16Bits(key ? ra : a);
            dst[j + half] = F32ToBf16Bits(key ? rc : c);
          }
        }
      }
    }
  });
}

cudaError_t SwiGlu(const float* gu, uint32_t batch, uint32_t ffn, uint16_t* out,
                   cudaStream_t stream) {
  if (gu == nullptr || out == nullptr || batch == 0 || batch > 65535 || ffn == 0) {
    return cudaErrorInvalidValue;
  }
  return cudasim::Launch(stream, "SwiGlu", [=] {
    if (!Touch(gu, uint64_t{batch} * 2 * ffn * 4, "gu") ||
        !Touch(out, uint64_t{batch} * ffn * 2, "out")) {
      return;
    }
    for (uint32_t b = 0; b < batch; ++b) {
      for (uint32_t i = 0; i < ffn; ++i) {
        const float g = gu[uint64_t{b} * 2 * ffn + i], u = gu[uint64_t{b} * 2 * ffn + ffn + i];
        out[uint64_t{b} * ffn + i] = F32ToBf16Bits(g / (1.f + std::exp(-g)) * u);
      }
    }
  });
}

cudaError_t AddInPlace(float* x, const float* y, uint64_t n, cudaStream_t stream) {
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "AddInPlace", [=] {
    if (!Touch(x, n * 4, "x") || !Touch(y, n * 4, "y")) return;
    for (uint64_t i = 0; i < n; ++i) x[i] += y[i];
  });
}

cudaError_t CastF32ToBf16(const float* src, uint64_t n, uint16_t* dst, cudaStream_t stream) {
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return cudasim::Launch(stream, "CastF32ToBf16", [=] {
    if (!Touch(src, n * 4, "src") || !Touch(dst, n * 2, "dst")) return;
    for (uint64_t i = 0; i < n; ++i) dst[i] = F32ToBf16Bits(src[i]);
  });
}

cudaError_t AdvancePositions(int32_t* positions, int32_t* lengths, uint32_t batch,
                             cudaStream_t stream) {
  if (positions == nullptr || batch == 0) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "AdvancePositions", [=] {
    if (!Touch(positions, uint64_t{batch} * 4, "positions") ||
        (lengths != nullptr && !Touch(lengths, uint64_t{batch} * 4, "lengths"))) {
      return;
    }
    for (uint32_t b = 0; b < batch; ++b) {
      positions[b] += 1;
      if (lengths != nullptr) lengths[b] = positions[b] + 1;
    }
  });
}

cudaError_t ArgmaxRows(const float* logits, uint32_t rows, uint32_t vocab, int32_t* out,
                       cudaStream_t stream) {
  if (logits == nullptr || out == nullptr || rows == 0 || vocab == 0) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "ArgmaxRows", [=] {
    if (!Touch(logits, uint64_t{rows} * vocab * 4, "logits") ||
        !Touch(out, uint64_t{rows} * 4, "out")) {
      return;
    }
    for (uint32_t r = 0; r < rows; ++r) {
      const float* row = logits + uint64_t{r} * vocab;
      int32_t best = 0;
      for (uint32_t i = 1; i < vocab; ++i) {
        if (row[i] > row[best]) best = static_cast<int32_t>(i);
      }
      out[r] = best;
    }
  });
}

}  // namespace kvtier::worker::kernels::cuda
