#ifndef KVTIER_WORKER_KERNELS_CUDA_DTYPE_H_
#define KVTIER_WORKER_KERNELS_CUDA_DTYPE_H_

// Element types of KV blocks on the device, and exact host-side bf16 conversions (round to
// nearest even), shared by kernels' launchers, tests and the engine. No CUDA headers.

#include <cstdint>
#include <cstring>

namespace kvtier::worker::kernels::cuda {

enum class KvDtype : uint8_t { kF32 = 0, kBf16 = 1 };

inline uint32_t DtypeBytes(KvDtype t) { return t == KvDtype::kF32 ? 4 : 2; }

// f32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToF32(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_DTYPE_H_
