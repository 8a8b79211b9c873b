#ifndef KVTIER_WORKER_CODECS_CODEC_INTERNAL_H_
#define KVTIER_WORKER_CODECS_CODEC_INTERNAL_H_

// Helpers shared by the codec implementations. Not part of the public API.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

// Run-time dispatch for the hot loops: GCC/Clang build an AVX2+FMA clone and a portable one and
// pick at load time (ifunc). The bodies are plain loops written to auto-vectorize. Not under
// ThreadSanitizer: GCC instruments the ifunc resolver, which the loader runs before the
// sanitizer's runtime is up, and the process dies before main.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KVTIER_CODEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVTIER_CODEC_CLONES
#endif

namespace kvtier::worker::codecs::internal {

inline float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}
inline void StoreF32(uint8_t* p, float f) { std::memcpy(p, &f, sizeof f); }

// Asymmetric 8-bit parameters for a group with range [lo, hi].
struct Affine {
  float scale;  // (hi - lo) / 255, 0 for a constant group
  float inv;    // 1 / scale, 0 for a constant group
  float lo;
};
inline Affine MakeAffine(float lo, float hi) {
  const float scale = (hi - lo) / 255.f;
  // Divide unconditionally (then select) so loops over groups vectorize under -ftrapping-math.
  const float r = 1.f / std::max(scale, std::numeric_limits<float>::min());
  return {scale, scale > 0.f ? r : 0.f, lo};
}

}  // namespace kvtier::worker::codecs::internal

#endif  // KVTIER_WORKER_CODECS_CODEC_INTERNAL_H_
