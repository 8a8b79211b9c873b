#ifndef KVTIER_WORKER_KERNELS_CUDA_CODEC_REFERENCE_H_
#define KVTIER_WORKER_KERNELS_CUDA_CODEC_REFERENCE_H_

// The GPU codec kernels' algorithm written as plain host loops over codec_math: the reference the
// GPU tests compare the kernels with, and what the unit tests check against the CPU codecs
// (worker/codecs) byte for byte. Layouts: kv_ops.h. No CUDA.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "worker/kernels/cuda/codec_math.h"

namespace kvtier::worker::kernels::cuda::reference {

enum class Codec : uint8_t { kInt8Kivi = 0, kFp8E4m3 = 1, kMinMax = 2 };  // as CodecKind

inline uint64_t EncodedBytes(Codec codec, bool key, uint32_t rows, uint32_t cols) {
  const uint64_t codes = uint64_t{rows} * cols;
  if (codec == Codec::kFp8E4m3) return uint64_t{rows} * 4 + codes;
  if (codec == Codec::kMinMax) return 8 + codes;
  return (key ? cols : rows) * uint64_t{8} + codes;
}

// One affine group: elements src[first + i * stride], i < n.
inline void EncodeGroup(const float* src, uint64_t first, uint64_t stride, uint64_t n,
                        float* scale_out, float* lo_out, uint8_t* codes) {
  namespace cm = codec_math;
  float lo = n > 0 ? src[first] : 0.f, hi = lo;
  for (uint64_t i = 1; i < n; ++i) {
    lo = cm::Min(lo, src[first + i * stride]);
    hi = cm::Max(hi, src[first + i * stride]);
  }
  const cm::Affine a = cm::MakeAffine(lo, hi);
  const float bias = cm::Bias(lo, a.inv);
  std::memcpy(scale_out, &a.scale, 4);
  std::memcpy(lo_out, &lo, 4);
  for (uint64_t i = 0; i < n; ++i) {
    codes[first + i * stride] = cm::QuantizeU8(src[first + i * stride], a.inv, bias);
  }
}

// src: [rows][cols] f32 -> dst: EncodedBytes bytes.
inline void Encode(Codec codec, bool key, const float* src, uint32_t rows, uint32_t cols,
                   uint8_t* dst) {
  namespace cm = codec_math;
  float* f = reinterpret_cast<float*>(dst);
  if (codec == Codec::kMinMax) {
    EncodeGroup(src, 0, 1, uint64_t{rows} * cols, f, f + 1, dst + 8);
    return;
  }
  if (codec == Codec::kFp8E4m3) {
    uint8_t* codes = dst + uint64_t{rows} * 4;
    for (uint32_t r = 0; r < rows; ++r) {
      float amax = 0.f;
      for (uint32_t c = 0; c < cols; ++c) amax = cm::Max(amax, std::fabs(src[r * cols + c]));
      const cm::Affine a = cm::MakeFp8(amax);
      std::memcpy(f + r, &a.scale, 4);
      for (uint32_t c = 0; c < cols; ++c) {
        codes[r * cols + c] = cm::EncodeE4m3(cm::Mul(src[r * cols + c], a.inv));
      }
    }
    return;
  }
  if (key) {  // per channel
    for (uint32_t c = 0; c < cols; ++c) {
      EncodeGroup(src, c, cols, rows, f + c, f + cols + c, dst + uint64_t{cols} * 8);
    }
  } else {  // per token
    for (uint32_t r = 0; r < rows; ++r) {
      EncodeGroup(src, uint64_t{r} * cols, 1, cols, f + r, f + rows + r, dst + uint64_t{rows} * 8);
    }
  }
}

// What Encode wrote -> [rows][cols] f32.
inline void Decode(Codec codec, bool key, const uint8_t* src, uint32_t rows, uint32_t cols,
                   float* dst) {
  namespace cm = codec_math;
  auto f = [&](uint64_t i) {
    float v;
    std::memcpy(&v, src + 4 * i, 4);
    return v;
  };
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < cols; ++c) {
      const uint64_t i = uint64_t{r} * cols + c;
      float x;
      if (codec == Codec::kMinMax) {
        x = cm::DequantizeU8(src[8 + i], f(1), f(0));
      } else if (codec == Codec::kFp8E4m3) {
        x = cm::Mul(cm::DecodeE4m3(src[uint64_t{rows} * 4 + i]), f(r));
      } else if (key) {
        x = cm::DequantizeU8(src[uint64_t{cols} * 8 + i], f(cols + c), f(c));
      } else {
        x = cm::DequantizeU8(src[uint64_t{rows} * 8 + i], f(rows + r), f(r));
      }
      dst[i] = x;
    }
  }
}

}  // namespace kvtier::worker::kernels::cuda::reference

#endif  // KVTIER_WORKER_KERNELS_CUDA_CODEC_REFERENCE_H_
