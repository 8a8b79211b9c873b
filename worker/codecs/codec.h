#ifndef KVTIER_WORKER_CODECS_CODEC_H_
#define KVTIER_WORKER_CODECS_CODEC_H_

// T2 codecs: pure functions that turn one [rows][cols] f32 tensor (one layer's K or V of one
// page: rows = tokens, cols = num_kv_heads * head_dim) into 8-bit codes plus scales, and back.
// No allocation, no state; thread-safe. Buffers are raw pointers; `dst` of Encode must hold
// EncodedBytes(role, rows, cols) bytes and needs no alignment.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::worker::codecs {

// Keys and values are quantized along different axes (KIVI): the role says which one a tensor is.
enum class TensorRole : uint8_t { kKey = 0, kValue = 1 };

struct Codec {
  std::string_view name;
  // Bytes Encode writes for a [rows][cols] tensor.
  uint64_t (*encoded_bytes)(TensorRole role, uint32_t rows, uint32_t cols);
  // src: [rows][cols] f32 -> dst: EncodedBytes bytes. Non-finite inputs are not supported.
  void (*encode)(TensorRole role, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst);
  // src: what Encode wrote for the same (role, rows, cols) -> dst: [rows][cols] f32.
  void (*decode)(TensorRole role, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst);
};

// int8 KIVI: asymmetric min-max uint8 codes with an f32 scale and an f32 minimum per group;
// keys grouped per channel (over the page's tokens), values per token (over the channels).
// x ≈ min + code * scale, scale = (max - min) / 255; error ≤ scale / 2 per element.
const Codec& Int8KiviCodec();
// fp8 e4m3 (OCP "e4m3fn": max 448, no infinities) per token: one f32 scale per row
// (absmax / 448) for keys and values alike; codes round to nearest even and saturate.
const Codec& Fp8E4m3Codec();
// The paper's per-tensor min-max 8-bit scheme (one scale and minimum for the whole tensor),
// kept as a named comparison option.
const Codec& MinMaxCodec();

// Registry: "int8_kivi", "fp8_e4m3", "minmax". INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<const Codec*> FindCodec(std::string_view name);
std::vector<std::string_view> CodecNames();

}  // namespace kvtier::worker::codecs

#endif  // KVTIER_WORKER_CODECS_CODEC_H_
