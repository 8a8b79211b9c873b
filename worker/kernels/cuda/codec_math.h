#ifndef KVTIER_WORKER_KERNELS_CUDA_CODEC_MATH_H_
#define KVTIER_WORKER_KERNELS_CUDA_CODEC_MATH_H_

// Scalar arithmetic of the T2 codecs, compiled for host and device from one source so the GPU
// produces the same bytes as the CPU codecs (worker/codecs): int8 KIVI / min-max affine uint8
// and fp8 e4m3 ("e4m3fn"). Rounding follows the CPU codecs step by step: the affine code is
// trunc(clamp(fma(x, inv, bias))) with bias = 0.5 - lo * inv rounded separately (the CPU's AVX2
// path fuses that multiply-add; its portable path rounds twice and may differ by one code on an
// exact tie); every other multiply and add is rounded separately on the device (no contraction).
// Division is IEEE on both sides (nvcc's default -prec-div=true).

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVTIER_HD __host__ __device__ inline
#else
#define KVTIER_HD inline
#endif

namespace kvtier::worker::kernels::cuda::codec_math {

KVTIER_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVTIER_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVTIER_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KVTIER_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
KVTIER_HD uint32_t Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVTIER_HD float FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
KVTIER_HD float Min(float a, float b) { return b < a ? b : a; }
KVTIER_HD float Max(float a, float b) { return a < b ? b : a; }

// Affine uint8 parameters of a group with range [lo, hi]: x ~ lo + code * scale.
struct Affine {
  float scale;  // (hi - lo) / 255, 0 for a constant group
  float inv;    // 1 / scale, 0 for a constant group
};
KVTIER_HD Affine MakeAffine(float lo, float hi) {
  const float scale = Sub(hi, lo) / 255.f;
  return {scale, scale > 0.f ? 1.f / scale : 0.f};
}
// 0.5 - lo * inv: the rounding offset of the group, folded so a code is one fused multiply-add.
KVTIER_HD float Bias(float lo, float inv) { return Sub(0.5f, Mul(lo, inv)); }
KVTIER_HD uint8_t QuantizeU8(float x, float inv, float bias) {
  float q = Fma(x, inv, bias);
  q = Min(Max(q, 0.f), 255.f);
  return static_cast<uint8_t>(static_cast<int32_t>(q));
}
KVTIER_HD float DequantizeU8(uint8_t code, float lo, float scale) {
  return Add(lo, Mul(static_cast<float>(code), scale));
}

inline constexpr float kE4m3Max = 448.f;

// Round to nearest even, saturate to +-448, NaN -> 0x7F with the sign kept.
KVTIER_HD uint8_t EncodeE4m3(float x) {
  const uint32_t bits = Bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7F;
  if (abs >= 0x43E00000u) return sign | 0x7E;
  if (abs < 0x3C800000u) {  // subnormal: multiples of 2^-9, rounded by the 2^23 trick
    const float a = Mul(FromBits(abs), 512.f);
    const float rounded = Sub(Add(a, 8388608.f), 8388608.f);
    return sign | static_cast<uint8_t>(rounded);
  }
  const uint32_t r = (abs + 0x7FFFFu + ((abs >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(r - (120u << 3));
}

// Exact: every e4m3 code is an f32.
KVTIER_HD float DecodeE4m3(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xF, m = code & 0x7;
  const uint32_t sign = uint32_t{code & 0x80u} << 24;
  if ((code & 0x7F) == 0x7F) return FromBits(sign | 0x7FC00000u);
  if (e == 0) {
    const float mag = static_cast<float>(m) / 512.f;
    return sign ? -mag : mag;
  }
  return FromBits(sign | ((e + 120u) << 23) | (m << 20));
}

// Per-row fp8 parameters from the row's absolute maximum.
KVTIER_HD Affine MakeFp8(float absmax) {
  const float scale = absmax / kE4m3Max;
  return {scale, scale > 0.f ? kE4m3Max / absmax : 0.f};
}

}  // namespace kvtier::worker::kernels::cuda::codec_math

#endif  // KVTIER_WORKER_KERNELS_CUDA_CODEC_MATH_H_
