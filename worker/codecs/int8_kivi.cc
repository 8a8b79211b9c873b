// int8 KIVI: keys per channel, values per token; asymmetric min-max uint8 with f32 scale + min.

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

#include "worker/codecs/codec.h"
#include "worker/codecs/codec_internal.h"

namespace kvtier::worker::codecs {
namespace {

using internal::LoadF32;
using internal::StoreF32;

uint64_t KiviBytes(TensorRole role, uint32_t rows, uint32_t cols) {
  const uint64_t groups = role == TensorRole::kKey ? cols : rows;
  return groups * 2 * sizeof(float) + uint64_t{rows} * cols;
}

bool UseAvx2();

#if defined(__x86_64__) && defined(__GNUC__)
// Per-column min/max over rows, 32 columns at a time in registers.
__attribute__((target("avx2"))) void ColumnRangeAvx2(const float* src, uint32_t rows, uint32_t cols,
                                                     float* lo, float* hi) {
  uint32_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    __m256 l[4], h[4];
    for (int j = 0; j < 4; ++j) l[j] = h[j] = _mm256_loadu_ps(src + c + 8 * j);
    for (uint32_t r = 1; r < rows; ++r) {
      const float* row = src + uint64_t{r} * cols + c;
      for (int j = 0; j < 4; ++j) {
        const __m256 x = _mm256_loadu_ps(row + 8 * j);
        l[j] = _mm256_min_ps(l[j], x);
        h[j] = _mm256_max_ps(h[j], x);
      }
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(lo + c + 8 * j, l[j]);
      _mm256_storeu_ps(hi + c + 8 * j, h[j]);
    }
  }
  for (; c < cols; ++c) {
    lo[c] = hi[c] = src[c];
    for (uint32_t r = 1; r < rows; ++r) {
      lo[c] = std::min(lo[c], src[uint64_t{r} * cols + c]);
      hi[c] = std::max(hi[c], src[uint64_t{r} * cols + c]);
    }
  }
}
#endif

void ColumnRange(const float* src, uint32_t rows, uint32_t cols, float* lo, float* hi) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return ColumnRangeAvx2(src, rows, cols, lo, hi);
#endif
  std::copy(src, src + cols, lo);
  std::copy(src, src + cols, hi);
  for (uint32_t r = 1; r < rows; ++r) {
    const float* row = src + uint64_t{r} * cols;
    for (uint32_t c = 0; c < cols; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
}

// Quantization: code = round_half_up((x - lo) * inv), computed as x * inv + (0.5 - lo * inv)
// so the AVX2 path is one FMA per element; codes saturate to [0, 255].
inline uint8_t QuantizeFma(float x, float inv, float bias) {
  float q = x * inv + bias;
  q = std::min(std::max(q, 0.f), 255.f);
  return static_cast<uint8_t>(static_cast<int32_t>(q));
}

#if defined(__x86_64__) && defined(__GNUC__)
// 32 codes from 32 floats: 4 FMAs, truncating converts and saturating packs.
__attribute__((target("avx2,fma"))) inline void Quantize32Avx2(const float* x, __m256 inv0,
                                                               __m256 inv1, __m256 inv2,
                                                               __m256 inv3, __m256 b0, __m256 b1,
                                                               __m256 b2, __m256 b3, uint8_t* dst) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i i0 =
      _mm256_cvttps_epi32(_mm256_max_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x), inv0, b0), zero));
  const __m256i i1 =
      _mm256_cvttps_epi32(_mm256_max_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + 8), inv1, b1), zero));
  const __m256i i2 =
      _mm256_cvttps_epi32(_mm256_max_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + 16), inv2, b2), zero));
  const __m256i i3 =
      _mm256_cvttps_epi32(_mm256_max_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + 24), inv3, b3), zero));
  const __m256i w01 = _mm256_packus_epi32(i0, i1);  // lanes interleaved per 128-bit half
  const __m256i w23 = _mm256_packus_epi32(i2, i3);
  const __m256i b = _mm256_packus_epi16(w01, w23);
  const __m256i fixed = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), fixed);
}

__attribute__((target("avx2,fma"))) void QuantizeRowPerColumnAvx2(const float* row, uint32_t cols,
                                                                  const float* inv,
                                                                  const float* bias, uint8_t* dst) {
  uint32_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    Quantize32Avx2(row + c, _mm256_loadu_ps(inv + c), _mm256_loadu_ps(inv + c + 8),
                   _mm256_loadu_ps(inv + c + 16), _mm256_loadu_ps(inv + c + 24),
                   _mm256_loadu_ps(bias + c), _mm256_loadu_ps(bias + c + 8),
                   _mm256_loadu_ps(bias + c + 16), _mm256_loadu_ps(bias + c + 24), dst + c);
  }
  for (; c < cols; ++c) dst[c] = QuantizeFma(row[c], inv[c], bias[c]);
}

__attribute__((target("avx2,fma"))) void QuantizeRowAvx2(const float* row, uint32_t cols, float inv,
                                                         float bias, uint8_t* dst) {
  const __m256 vi = _mm256_set1_ps(inv), vb = _mm256_set1_ps(bias);
  uint32_t c = 0;
  for (; c + 32 <= cols; c += 32) Quantize32Avx2(row + c, vi, vi, vi, vi, vb, vb, vb, vb, dst + c);
  for (; c < cols; ++c) dst[c] = QuantizeFma(row[c], inv, bias);
}

bool UseAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
bool UseAvx2() { return false; }
#endif

void QuantizeRowPerColumn(const float* row, uint32_t cols, const float* inv, const float* bias,
                          uint8_t* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return QuantizeRowPerColumnAvx2(row, cols, inv, bias, dst);
#endif
  for (uint32_t c = 0; c < cols; ++c) dst[c] = QuantizeFma(row[c], inv[c], bias[c]);
}

void QuantizeRow(const float* row, uint32_t cols, float inv, float bias, uint8_t* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return QuantizeRowAvx2(row, cols, inv, bias, dst);
#endif
  for (uint32_t c = 0; c < cols; ++c) dst[c] = QuantizeFma(row[c], inv, bias);
}

KVTIER_CODEC_CLONES void DequantizeRowPerColumn(const uint8_t* codes, uint32_t cols,
                                                const float* lo, const float* scale, float* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = lo[c] + static_cast<float>(codes[c]) * scale[c];
}

// Min and max of a row (exact, so lane order does not matter).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void RowRangeAvx2(const float* row, uint32_t cols, float* lo,
                                                  float* hi) {
  __m256 l0 = _mm256_set1_ps(row[0]), h0 = l0, l1 = l0, h1 = l0;
  uint32_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 a = _mm256_loadu_ps(row + c), b = _mm256_loadu_ps(row + c + 8);
    l0 = _mm256_min_ps(l0, a);
    h0 = _mm256_max_ps(h0, a);
    l1 = _mm256_min_ps(l1, b);
    h1 = _mm256_max_ps(h1, b);
  }
  alignas(32) float ls[8], hs[8];
  _mm256_store_ps(ls, _mm256_min_ps(l0, l1));
  _mm256_store_ps(hs, _mm256_max_ps(h0, h1));
  float l = ls[0], h = hs[0];
  for (int j = 1; j < 8; ++j) {
    l = std::min(l, ls[j]);
    h = std::max(h, hs[j]);
  }
  for (; c < cols; ++c) {
    l = std::min(l, row[c]);
    h = std::max(h, row[c]);
  }
  *lo = l;
  *hi = h;
}
#endif

void RowRange(const float* row, uint32_t cols, float* lo, float* hi) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return RowRangeAvx2(row, cols, lo, hi);
#endif
  float l = row[0], h = row[0];
  for (uint32_t c = 1; c < cols; ++c) {
    l = std::min(l, row[c]);
    h = std::max(h, row[c]);
  }
  *lo = l;
  *hi = h;
}

KVTIER_CODEC_CLONES void DequantizeRow(const uint8_t* codes, uint32_t cols, float lo, float scale,
                                       float* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = lo + static_cast<float>(codes[c]) * scale;
}

KVTIER_CODEC_CLONES void ColumnAffine(const float* lo, const float* hi, uint32_t cols, float* scale,
                                      float* inv, float* bias) {
  for (uint32_t c = 0; c < cols; ++c) {
    const internal::Affine a = internal::MakeAffine(lo[c], hi[c]);
    scale[c] = a.scale;
    inv[c] = a.inv;
    bias[c] = 0.5f - lo[c] * a.inv;
  }
}

// Key layout: [cols] f32 scale, [cols] f32 min, [rows][cols] codes.
void EncodeKeys(const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  thread_local std::vector<float> lo, hi, inv, scale, bias;
  lo.resize(cols), hi.resize(cols), inv.resize(cols), scale.resize(cols), bias.resize(cols);
  if (rows > 0) ColumnRange(src, rows, cols, lo.data(), hi.data());
  ColumnAffine(lo.data(), hi.data(), cols, scale.data(), inv.data(), bias.data());
  std::memcpy(dst, scale.data(), uint64_t{cols} * 4);
  std::memcpy(dst + uint64_t{cols} * 4, lo.data(), uint64_t{cols} * 4);
  uint8_t* codes = dst + uint64_t{cols} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    QuantizeRowPerColumn(src + uint64_t{r} * cols, cols, inv.data(), bias.data(),
                         codes + uint64_t{r} * cols);
  }
}

void DecodeKeys(const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  thread_local std::vector<float> scale, lo;
  scale.resize(cols), lo.resize(cols);
  std::memcpy(scale.data(), src, uint64_t{cols} * 4);
  std::memcpy(lo.data(), src + uint64_t{cols} * 4, uint64_t{cols} * 4);
  const uint8_t* codes = src + uint64_t{cols} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    DequantizeRowPerColumn(codes + uint64_t{r} * cols, cols, lo.data(), scale.data(),
                           dst + uint64_t{r} * cols);
  }
}

// Value layout: [rows] f32 scale, [rows] f32 min, [rows][cols] codes.
void EncodeValues(const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  uint8_t* codes = dst + uint64_t{rows} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = src + uint64_t{r} * cols;
    float lo = 0.f, hi = 0.f;
    if (cols > 0) RowRange(row, cols, &lo, &hi);
    const internal::Affine a = internal::MakeAffine(lo, hi);
    StoreF32(dst + uint64_t{r} * 4, a.scale);
    StoreF32(dst + (uint64_t{rows} + r) * 4, lo);
    QuantizeRow(row, cols, a.inv, 0.5f - lo * a.inv, codes + uint64_t{r} * cols);
  }
}

void DecodeValues(const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  const uint8_t* codes = src + uint64_t{rows} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    DequantizeRow(codes + uint64_t{r} * cols, cols, LoadF32(src + (uint64_t{rows} + r) * 4),
                  LoadF32(src + uint64_t{r} * 4), dst + uint64_t{r} * cols);
  }
}

void KiviEncode(TensorRole role, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  if (role == TensorRole::kKey) {
    EncodeKeys(src, rows, cols, dst);
  } else {
    EncodeValues(src, rows, cols, dst);
  }
}

void KiviDecode(TensorRole role, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  if (role == TensorRole::kKey) {
    DecodeKeys(src, rows, cols, dst);
  } else {
    DecodeValues(src, rows, cols, dst);
  }
}

}  // namespace

const Codec& Int8KiviCodec() {
  static constexpr Codec kCodec{"int8_kivi", &KiviBytes, &KiviEncode, &KiviDecode};
  return kCodec;
}

// The per-tensor scheme shares the row helpers: the whole tensor is one "row".
namespace {

uint64_t MinMaxBytes(TensorRole, uint32_t rows, uint32_t cols) {
  return 2 * sizeof(float) + uint64_t{rows} * cols;
}

// Layout: f32 scale, f32 min, [rows][cols] codes.
void MinMaxEncode(TensorRole, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  const uint64_t n = uint64_t{rows} * cols;
  float lo = 0.f, hi = 0.f;
  if (n > 0) RowRange(src, static_cast<uint32_t>(n), &lo, &hi);
  const internal::Affine a = internal::MakeAffine(lo, hi);
  StoreF32(dst, a.scale);
  StoreF32(dst + 4, lo);
  QuantizeRow(src, static_cast<uint32_t>(n), a.inv, 0.5f - lo * a.inv, dst + 8);
}

void MinMaxDecode(TensorRole, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  DequantizeRow(src + 8, rows * cols, LoadF32(src + 4), LoadF32(src), dst);
}

}  // namespace

const Codec& MinMaxCodec() {
  static constexpr Codec kCodec{"minmax", &MinMaxBytes, &MinMaxEncode, &MinMaxDecode};
  return kCodec;
}

}  // namespace kvtier::worker::codecs
