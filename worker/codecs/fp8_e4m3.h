#ifndef KVTIER_WORKER_CODECS_FP8_E4M3_H_
#define KVTIER_WORKER_CODECS_FP8_E4M3_H_

// fp8 e4m3 in the OCP "e4m3fn" flavour: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
// no infinities; 0x7F/0xFF are NaN; largest finite 448; smallest subnormal 2^-9.
// Pure functions; thread-safe.

#include <cstdint>

namespace kvtier::worker::codecs {

inline constexpr float kE4m3Max = 448.f;

// Rounds to the nearest representable value, ties to even; saturates to ±448 (finite inputs
// of any magnitude, and ±inf); NaN encodes as 0x7F with the sign kept.
uint8_t EncodeE4m3(float x);
// Exact: every code is a float.
float DecodeE4m3(uint8_t code);

}  // namespace kvtier::worker::codecs

#endif  // KVTIER_WORKER_CODECS_FP8_E4M3_H_
