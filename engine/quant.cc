#include "engine/quant.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::engine {
namespace {

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ6_K) == 210);

float Bf16ToFp32(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void DequantQ6_KBlock(const BlockQ6_K& b, float* y) {
  const float d = Fp16ToFp32(b.d);
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ---- scalar dot products ----

void AxpyScalar(float a, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float DotF32Scalar(const void* row, const float* x, size_t n) {
  const float* w = static_cast<const float*>(row);
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += w[i] * x[i];
  return s;
}
float DotF16Scalar(const void* row, const float* x, size_t n) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += Fp16ToFp32(w[i]) * x[i];
  return s;
}
float DotBf16Scalar(const void* row, const float* x, size_t n) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += Bf16ToFp32(w[i]) * x[i];
  return s;
}
float DotQ4_0Scalar(const void* row, const float* x, size_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(row);
  float s = 0;
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float qx = 0;
    for (int j = 0; j < 16; ++j) {
      qx += ((b[i].qs[j] & 0xF) - 8) * x[j] + ((b[i].qs[j] >> 4) - 8) * x[j + 16];
    }
    s += Fp16ToFp32(b[i].d) * qx;
  }
  return s;
}
float DotQ4_1Scalar(const void* row, const float* x, size_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row);
  float s = 0;
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float qx = 0, sx = 0;
    for (int j = 0; j < 16; ++j) {
      qx += (b[i].qs[j] & 0xF) * x[j] + (b[i].qs[j] >> 4) * x[j + 16];
      sx += x[j] + x[j + 16];
    }
    s += Fp16ToFp32(b[i].d) * qx + Fp16ToFp32(b[i].m) * sx;
  }
  return s;
}
float DotQ8_0Scalar(const void* row, const float* x, size_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row);
  float s = 0;
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float qx = 0;
    for (int j = 0; j < 32; ++j) qx += b[i].qs[j] * x[j];
    s += Fp16ToFp32(b[i].d) * qx;
  }
  return s;
}
float DotQ6_KScalar(const void* row, const float* x, size_t n) {
  const BlockQ6_K* b = static_cast<const BlockQ6_K*>(row);
  float y[256];
  float s = 0;
  for (size_t i = 0; i < n / 256; ++i, x += 256) {
    DequantQ6_KBlock(b[i], y);
    for (int j = 0; j < 256; ++j) s += y[j] * x[j];
  }
  return s;
}

// ---- AVX2 / FMA / F16C dot products ----
#if defined(__x86_64__)
#define KVTIER_AVX2 __attribute__((target("avx2,fma,f16c")))

KVTIER_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
KVTIER_AVX2 inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
KVTIER_AVX2 inline __m256 U8ToPs(__m128i bytes) {  // low 8 bytes
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}
KVTIER_AVX2 inline __m256 I8ToPs(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

KVTIER_AVX2 float DotF32Avx2(const void* row, const float* x, size_t n) {
  const float* w = static_cast<const float*>(row);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}
KVTIER_AVX2 float DotF16Avx2(const void* row, const float* x, size_t n) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  __m256 a = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    a = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), a);
  }
  float s = HSum(a);
  for (; i < n; ++i) s += HalfToFloat(w[i]) * x[i];
  return s;
}

// Σ_j q[j]·x[j] over one 32-element block of 4-bit values and Σ_j x[j] (as vectors).
KVTIER_AVX2 inline void Nibbles32(const uint8_t* qs, const float* x, __m256* qx, __m256* sx) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
  const __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
  __m256 p = _mm256_mul_ps(U8ToPs(lo), x0);
  p = _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(lo, 8)), x1, p);
  p = _mm256_fmadd_ps(U8ToPs(hi), x2, p);
  *qx = _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(hi, 8)), x3, p);
  *sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
}

KVTIER_AVX2 float DotQ4_1Avx2(const void* row, const float* x, size_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row);
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    __m256 qx, sx;
    Nibbles32(b[i].qs, x, &qx, &sx);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), qx, acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].m)), sx, accm);
  }
  return HSum(_mm256_add_ps(acc, accm));
}
KVTIER_AVX2 float DotQ4_0Avx2(const void* row, const float* x, size_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(row);
  __m256 acc = _mm256_setzero_ps();
  const __m256 eight = _mm256_set1_ps(8.f);
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    __m256 qx, sx;
    Nibbles32(b[i].qs, x, &qx, &sx);
    acc =
        _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), _mm256_fnmadd_ps(eight, sx, qx), acc);
  }
  return HSum(acc);
}
KVTIER_AVX2 float DotQ8_0Avx2(const void* row, const float* x, size_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16));
    __m256 p = _mm256_mul_ps(I8ToPs(q0), _mm256_loadu_ps(x));
    p = _mm256_fmadd_ps(I8ToPs(_mm_srli_si128(q0, 8)), _mm256_loadu_ps(x + 8), p);
    p = _mm256_fmadd_ps(I8ToPs(q1), _mm256_loadu_ps(x + 16), p);
    p = _mm256_fmadd_ps(I8ToPs(_mm_srli_si128(q1, 8)), _mm256_loadu_ps(x + 24), p);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), p, acc);
  }
  return HSum(acc);
}

KVTIER_AVX2 void AxpyAvx2(float a, const float* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

// Q4_1 · x with the activation's per-block sums precomputed (BlockSums): the m·Σx term needs
// one scalar fma per block instead of three vector adds and a vector fma.
KVTIER_AVX2 inline __m256 Q4Block(const uint8_t* qs, const float* x) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  __m256 p = _mm256_mul_ps(U8ToPs(lo), _mm256_loadu_ps(x));
  p = _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), p);
  p = _mm256_fmadd_ps(U8ToPs(hi), _mm256_loadu_ps(x + 16), p);
  return _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), p);
}

// Even blocks' m·Σx terms go to m0, odd ones' to m1. The loop handles a pair of blocks per
// iteration so that m0 and m1 stay in registers (chosen per block through a reference, GCC
// kept them on the stack: a store-to-load round trip on every block's chain).
KVTIER_AVX2 float DotQ4_1SumsAvx2(const void* row, const float* x, const float* sums, size_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row);
  const size_t nb = n / 32;
  __m256 acc = _mm256_setzero_ps();
  float m0 = 0, m1 = 0;
  size_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), Q4Block(b[i].qs, x + i * 32), acc);
    m0 = std::fma(HalfToFloat(b[i].m), sums[i], m0);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i + 1].d)),
                          Q4Block(b[i + 1].qs, x + (i + 1) * 32), acc);
    m1 = std::fma(HalfToFloat(b[i + 1].m), sums[i + 1], m1);
  }
  if (i < nb) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b[i].d)), Q4Block(b[i].qs, x + i * 32), acc);
    m0 = std::fma(HalfToFloat(b[i].m), sums[i], m0);
  }
  return HSum(acc) + (m0 + m1);
}

// One block of DotQ4_1x4SumsAvx2 for its four rows: acc[t] += d · (q · x_t), mt += m · Σx_t.
KVTIER_AVX2 inline void Q4BlockX4(const BlockQ4_1& blk, const float* x, const float* sums,
                                  size_t stride, size_t nb, __m256* acc, float* mt) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m256 q0 = U8ToPs(lo), q1 = U8ToPs(_mm_srli_si128(lo, 8));
  const __m256 q2 = U8ToPs(hi), q3 = U8ToPs(_mm_srli_si128(hi, 8));
  const __m256 d = _mm256_set1_ps(HalfToFloat(blk.d));
  const float m = HalfToFloat(blk.m);
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const float* xt = x + t * stride;
    __m256 p = _mm256_mul_ps(q0, _mm256_loadu_ps(xt));
    p = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xt + 8), p);
    p = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xt + 16), p);
    p = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xt + 24), p);
    acc[t] = _mm256_fmadd_ps(d, p, acc[t]);
    mt[t] = std::fma(m, sums[t * nb], mt[t]);
  }
}

// Four rows, bit-identical per row to DotQ4_1SumsAvx2 (same operations in the same order;
// pairs of blocks per iteration as there, so that every accumulator stays in a register).
KVTIER_AVX2 void DotQ4_1x4SumsAvx2(const void* row, const float* x, const float* sums,
                                   size_t stride, size_t n, float* out) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row);
  const size_t nb = n / 32;
  __m256 acc[4];
  float m0[4] = {0, 0, 0, 0}, m1[4] = {0, 0, 0, 0};
  for (int t = 0; t < 4; ++t) acc[t] = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    Q4BlockX4(b[i], x + i * 32, sums + i, stride, nb, acc, m0);
    Q4BlockX4(b[i + 1], x + (i + 1) * 32, sums + i + 1, stride, nb, acc, m1);
  }
  if (i < nb) Q4BlockX4(b[i], x + i * 32, sums + i, stride, nb, acc, m0);
  for (int t = 0; t < 4; ++t) out[t] = HSum(acc[t]) + (m0[t] + m1[t]);
}

// Four activation rows at once against one weight row: the block is unpacked once. Per row the
// arithmetic is exactly that of the single-row kernel above (same operations, same order), so
// batched and single-token results are bit-identical.
KVTIER_AVX2 void DotQ4_1x4Avx2(const void* row, const float* x, size_t stride, size_t n,
                               float* out) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(row);
  __m256 acc[4], accm[4];
  for (int t = 0; t < 4; ++t) acc[t] = accm[t] = _mm256_setzero_ps();
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (size_t i = 0; i < n / 32; ++i) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i lo = _mm_and_si128(bytes, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m256 q0 = U8ToPs(lo), q1 = U8ToPs(_mm_srli_si128(lo, 8));
    const __m256 q2 = U8ToPs(hi), q3 = U8ToPs(_mm_srli_si128(hi, 8));
    const __m256 d = _mm256_set1_ps(HalfToFloat(b[i].d)), m = _mm256_set1_ps(HalfToFloat(b[i].m));
    for (int t = 0; t < 4; ++t) {
      const float* xt = x + t * stride + i * 32;
      const __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
      const __m256 x2 = _mm256_loadu_ps(xt + 16), x3 = _mm256_loadu_ps(xt + 24);
      __m256 p = _mm256_mul_ps(q0, x0);
      p = _mm256_fmadd_ps(q1, x1, p);
      p = _mm256_fmadd_ps(q2, x2, p);
      p = _mm256_fmadd_ps(q3, x3, p);
      const __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
      acc[t] = _mm256_fmadd_ps(d, p, acc[t]);
      accm[t] = _mm256_fmadd_ps(m, sx, accm[t]);
    }
  }
  for (int t = 0; t < 4; ++t) out[t] = HSum(_mm256_add_ps(acc[t], accm[t]));
}

KVTIER_AVX2 void DotQ8_0x4Avx2(const void* row, const float* x, size_t stride, size_t n,
                               float* out) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row);
  __m256 acc[4];
  for (int t = 0; t < 4; ++t) acc[t] = _mm256_setzero_ps();
  for (size_t i = 0; i < n / 32; ++i) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16));
    const __m256 q0 = I8ToPs(r0), q1 = I8ToPs(_mm_srli_si128(r0, 8));
    const __m256 q2 = I8ToPs(r1), q3 = I8ToPs(_mm_srli_si128(r1, 8));
    const __m256 d = _mm256_set1_ps(HalfToFloat(b[i].d));
    for (int t = 0; t < 4; ++t) {
      const float* xt = x + t * stride + i * 32;
      __m256 p = _mm256_mul_ps(q0, _mm256_loadu_ps(xt));
      p = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xt + 8), p);
      p = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xt + 16), p);
      p = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xt + 24), p);
      acc[t] = _mm256_fmadd_ps(d, p, acc[t]);
    }
  }
  for (int t = 0; t < 4; ++t) out[t] = HSum(acc[t]);
}
#endif  // __x86_64__

}  // namespace

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t Fp32ToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return sign | 0x7C00 | (absx > 0x7F800000 ? 0x200 : 0);
  if (absx >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65520: overflow
  if (absx < 0x38800000) {                       // result subnormal or zero
    if (absx < 0x33000000) return sign;          // < 2^-25 rounds to 0
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (112 - e) + ... → shift of mantissa
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | half;
  }
  uint32_t r = absx - 0x38000000;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1FFF;
  uint32_t half = r >> 13;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return sign | half;
}

void DequantizeRow(GgmlType type, const void* src, float* y, size_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(y, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      const uint16_t* w = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) y[i] = Fp16ToFp32(w[i]);
      return;
    }
    case GgmlType::kBF16: {
      const uint16_t* w = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) y[i] = Bf16ToFp32(w[i]);
      return;
    }
    case GgmlType::kQ4_0: {
      const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
      for (size_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          y[j] = ((b[i].qs[j] & 0xF) - 8) * d;
          y[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
      for (size_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = Fp16ToFp32(b[i].d), m = Fp16ToFp32(b[i].m);
        for (int j = 0; j < 16; ++j) {
          y[j] = (b[i].qs[j] & 0xF) * d + m;
          y[j + 16] = (b[i].qs[j] >> 4) * d + m;
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
      for (size_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < 32; ++j) y[j] = b[i].qs[j] * d;
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
      for (size_t i = 0; i < n / 256; ++i, y += 256) DequantQ6_KBlock(b[i], y);
      return;
    }
  }
}

void QuantizeRowQ4_0(const float* x, void* dst, size_t n) {
  BlockQ4_0* b = static_cast<BlockQ4_0*>(dst);
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = Fp32ToFp16(d);
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(x[j] * id + 8.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<uint8_t>(x[j + 16] * id + 8.5f));
      b[i].qs[j] = q0 | (q1 << 4);
    }
  }
}

void QuantizeRowQ4_1(const float* x, void* dst, size_t n) {
  BlockQ4_1* b = static_cast<BlockQ4_1*>(dst);
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = Fp32ToFp16(d);
    b[i].m = Fp32ToFp16(min);
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>((x[j] - min) * id + 0.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<uint8_t>((x[j + 16] - min) * id + 0.5f));
      b[i].qs[j] = q0 | (q1 << 4);
    }
  }
}

void QuantizeRowQ8_0(const float* x, void* dst, size_t n) {
  BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
  for (size_t i = 0; i < n / 32; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = Fp32ToFp16(d);
    for (int j = 0; j < 32; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

KernelIsa DetectKernelIsa() {
  const char* env = std::getenv("KVTIER_KERNELS");
  if (env != nullptr && std::strcmp(env, "scalar") == 0) return KernelIsa::kScalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KernelIsa::kAvx2;
#endif
  return KernelIsa::kScalar;
}

const char* KernelIsaName(KernelIsa isa) { return isa == KernelIsa::kAvx2 ? "avx2" : "scalar"; }

VecDotFn GetVecDot(GgmlType type, KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2) {
    switch (type) {
      case GgmlType::kF32:
        return DotF32Avx2;
      case GgmlType::kF16:
        return DotF16Avx2;
      case GgmlType::kQ4_0:
        return DotQ4_0Avx2;
      case GgmlType::kQ4_1:
        return DotQ4_1Avx2;
      case GgmlType::kQ8_0:
        return DotQ8_0Avx2;
      default:
        break;
    }
  }
#endif
  switch (type) {
    case GgmlType::kF32:
      return DotF32Scalar;
    case GgmlType::kF16:
      return DotF16Scalar;
    case GgmlType::kBF16:
      return DotBf16Scalar;
    case GgmlType::kQ4_0:
      return DotQ4_0Scalar;
    case GgmlType::kQ4_1:
      return DotQ4_1Scalar;
    case GgmlType::kQ8_0:
      return DotQ8_0Scalar;
    case GgmlType::kQ6_K:
      return DotQ6_KScalar;
  }
  return DotF32Scalar;
}

void BlockSums(const float* x, size_t n, float* sums) {
  for (size_t b = 0; b < n / 32; ++b) {
    float s = 0;
    for (int j = 0; j < 32; ++j) s += x[b * 32 + j];
    sums[b] = s;
  }
}

VecDotSumsFn GetVecDotSums(GgmlType type, KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2 && type == GgmlType::kQ4_1) return DotQ4_1SumsAvx2;
#endif
  return nullptr;
}

VecDot4SumsFn GetVecDot4Sums(GgmlType type, KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2 && type == GgmlType::kQ4_1) return DotQ4_1x4SumsAvx2;
#endif
  return nullptr;
}

AxpyFn GetAxpy(KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2) return AxpyAvx2;
#endif
  return AxpyScalar;
}

VecDot4Fn GetVecDot4(GgmlType type, KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2 && type == GgmlType::kQ4_1) return DotQ4_1x4Avx2;
  if (isa == KernelIsa::kAvx2 && type == GgmlType::kQ8_0) return DotQ8_0x4Avx2;
#endif
  return nullptr;
}

}  // namespace kvtier::engine
