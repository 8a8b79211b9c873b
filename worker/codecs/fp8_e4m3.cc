#include "worker/codecs/fp8_e4m3.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "worker/codecs/codec.h"
#include "worker/codecs/codec_internal.h"

namespace kvtier::worker::codecs {
namespace {

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32Of448 = 0x43E00000u;          // 1.75 * 2^8
constexpr uint32_t kF32MinNormalE4m3 = 0x3C800000u;  // 2^-6
constexpr uint8_t kE4m3MaxCode = 0x7E;
constexpr uint8_t kE4m3NanCode = 0x7F;

// Branch-free body (selects, no early returns) so the row loops vectorize.
inline uint8_t EncodeE4m3Inline(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & kF32AbsMask;
  // Normal: round the 23-bit mantissa to 3 bits, ties to even; a carry bumps the exponent;
  // rebias the exponent 127 -> 7 (120 << 3). Garbage for small inputs, selected away below.
  const uint32_t normal = ((abs + 0x7FFFFu + ((abs >> 20) & 1u)) >> 20) - (120u << 3);
  // Subnormal: multiples of 2^-9. a * 512 is exact; adding 2^23 rounds to nearest even. A result
  // of 8 is code 0x08, the smallest normal, so it needs no special case.
  const float a = std::min(std::bit_cast<float>(abs) * 512.f, 16.f);
  const uint32_t subnormal =
      static_cast<uint32_t>(static_cast<int32_t>((a + 8388608.f) - 8388608.f));
  uint32_t code = abs < kF32MinNormalE4m3 ? subnormal : normal;
  code = abs >= kF32Of448 ? kE4m3MaxCode : code;  // saturate (448 itself is exact)
  code = abs > kF32Inf ? kE4m3NanCode : code;
  return static_cast<uint8_t>(sign | code);
}

constexpr float DecodeSlow(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xF;
  const uint32_t m = code & 0x7;
  if ((code & 0x7F) == kE4m3NanCode) return std::numeric_limits<float>::quiet_NaN();
  float mag = 0.f;
  if (e == 0) {
    mag = static_cast<float>(m) / 512.f;
  } else {
    mag = (1.f + static_cast<float>(m) / 8.f);
    for (uint32_t i = 7; i < e; ++i) mag *= 2.f;
    for (uint32_t i = e; i < 7; ++i) mag /= 2.f;
  }
  return (code & 0x80) ? -mag : mag;
}

constexpr std::array<float, 256> MakeTable() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = DecodeSlow(static_cast<uint8_t>(c));
  return t;
}
constexpr std::array<float, 256> kDecodeTable = MakeTable();

uint64_t Fp8Bytes(TensorRole, uint32_t rows, uint32_t cols) {
  return uint64_t{rows} * sizeof(float) + uint64_t{rows} * cols;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Eight codes (in the low bytes of 32-bit lanes) from eight floats: the scalar algorithm with
// selects.
__attribute__((target("avx2,fma"))) inline __m256i Encode8Avx2(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(kF32AbsMask));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(abs, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(abs, _mm256_set1_epi32(0x7FFFF)), odd),
                        20),
      _mm256_set1_epi32(120 << 3));
  const __m256 a = _mm256_min_ps(_mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(512.f)),
                                 _mm256_set1_ps(16.f));
  const __m256 magic = _mm256_set1_ps(8388608.f);
  const __m256i sub = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(a, magic), magic));
  // abs < 2^31, so signed compares are exact.
  __m256i code = _mm256_blendv_epi8(normal, sub,
                                    _mm256_cmpgt_epi32(_mm256_set1_epi32(kF32MinNormalE4m3), abs));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(kE4m3MaxCode),
                            _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kF32Of448 - 1)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(kE4m3NanCode),
                            _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kF32Inf)));
  return _mm256_or_si256(code, sign);
}

__attribute__((target("avx2,fma"))) void EncodeRowAvx2(const float* src, uint32_t cols, float inv,
                                                       uint8_t* dst) {
  const __m256 vi = _mm256_set1_ps(inv);
  uint32_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const __m256i c0 = Encode8Avx2(_mm256_mul_ps(_mm256_loadu_ps(src + c), vi));
    const __m256i c1 = Encode8Avx2(_mm256_mul_ps(_mm256_loadu_ps(src + c + 8), vi));
    const __m256i c2 = Encode8Avx2(_mm256_mul_ps(_mm256_loadu_ps(src + c + 16), vi));
    const __m256i c3 = Encode8Avx2(_mm256_mul_ps(_mm256_loadu_ps(src + c + 24), vi));
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  for (; c < cols; ++c) dst[c] = EncodeE4m3Inline(src[c] * inv);
}

bool UseAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// Max of |x| over the first multiple of 16 columns (exact: max is order-free); returns how
// many columns it covered.
__attribute__((target("avx2"))) uint32_t AbsMaxAvx2(const float* src, uint32_t cols, float* m) {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(kF32AbsMask));
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  uint32_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    m0 = _mm256_max_ps(m0, _mm256_and_ps(_mm256_loadu_ps(src + c), mask));
    m1 = _mm256_max_ps(m1, _mm256_and_ps(_mm256_loadu_ps(src + c + 8), mask));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (float v : lanes) *m = std::max(*m, v);
  return c;
}
#endif

void EncodeRow(const float* src, uint32_t cols, float inv, uint8_t* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) return EncodeRowAvx2(src, cols, inv, dst);
#endif
  for (uint32_t c = 0; c < cols; ++c) dst[c] = EncodeE4m3Inline(src[c] * inv);
}

KVTIER_CODEC_CLONES void DecodeRow(const uint8_t* src, uint32_t cols, float scale, float* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = kDecodeTable[src[c]] * scale;
}

float AbsMax(const float* src, uint32_t cols) {
  uint32_t c = 0;
  float m = 0.f;
#if defined(__x86_64__) && defined(__GNUC__)
  if (UseAvx2()) c = AbsMaxAvx2(src, cols, &m);
#endif
  for (; c < cols; ++c) m = std::max(m, std::fabs(src[c]));
  return m;
}

// Layout: [rows] f32 scales, then [rows][cols] codes.
void Fp8Encode(TensorRole, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  uint8_t* codes = dst + uint64_t{rows} * sizeof(float);
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = src + uint64_t{r} * cols;
    const float absmax = AbsMax(row, cols);
    const float scale = absmax / kE4m3Max;
    internal::StoreF32(dst + uint64_t{r} * sizeof(float), scale);
    EncodeRow(row, cols, scale > 0.f ? kE4m3Max / absmax : 0.f, codes + uint64_t{r} * cols);
  }
}

void Fp8Decode(TensorRole, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  const uint8_t* codes = src + uint64_t{rows} * sizeof(float);
  for (uint32_t r = 0; r < rows; ++r) {
    DecodeRow(codes + uint64_t{r} * cols, cols, internal::LoadF32(src + uint64_t{r} * 4),
              dst + uint64_t{r} * cols);
  }
}

}  // namespace

uint8_t EncodeE4m3(float x) { return EncodeE4m3Inline(x); }
float DecodeE4m3(uint8_t code) { return kDecodeTable[code]; }

const Codec& Fp8E4m3Codec() {
  static constexpr Codec kCodec{"fp8_e4m3", &Fp8Bytes, &Fp8Encode, &Fp8Decode};
  return kCodec;
}

}  // namespace kvtier::worker::codecs
