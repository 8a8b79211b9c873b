#ifndef KVTIER_WORKER_KERNELS_CUDA_KV_OPS_H_
#define KVTIER_WORKER_KERNELS_CUDA_KV_OPS_H_

// KV page kernels on the GPU: T2 quantization before a device-to-host copy, dequantization after
// a host-to-device copy, and page gather/scatter. FlashInfer-style: raw device pointers, one
// Params struct per kernel, launchers that take a stream, validate, and return a cudaError_t
// (cudaErrorInvalidValue for bad fields, nothing launched).
//
// Formats are the CPU codecs' (worker/codecs/codec.h), byte for byte, for one [rows][cols]
// tensor = one layer's K or V of one page (rows = page tokens, cols = kv_heads * head_dim):
//   int8 KIVI, keys:   [cols] f32 scale, [cols] f32 min, [rows][cols] uint8 codes (per channel)
//   int8 KIVI, values: [rows] f32 scale, [rows] f32 min, [rows][cols] uint8 codes (per token)
//   fp8 e4m3:          [rows] f32 scale (absmax / 448), [rows][cols] e4m3 codes (per token)
//   minmax:            f32 scale, f32 min, [rows][cols] uint8 codes (per tensor)
// A bf16 source is widened to f32 exactly first, so the codes equal the CPU codec's on the same
// values. Dequantized output is f32 (the CPU codec's values exactly) or bf16 (those, rounded).

#include <cstdint>

#include "worker/cuda/cuda_api.h"
#include "worker/kernels/cuda/dtype.h"

namespace kvtier::worker::kernels::cuda {

enum class CodecKind : uint8_t { kInt8Kivi = 0, kFp8E4m3 = 1, kMinMax = 2 };
enum class Role : uint8_t { kKey = 0, kValue = 1 };

// Bytes of one encoded [rows][cols] tensor (equal to the CPU codec's encoded_bytes).
uint64_t EncodedBytes(CodecKind codec, Role role, uint32_t rows, uint32_t cols);

struct QuantizeParams {
  // [num_tensors] device arrays of device pointers. src[i]: [rows][cols] of src_dtype, aligned to
  // its element; dst[i]: EncodedBytes(...) bytes, 4-byte aligned.
  const void* const* src = nullptr;
  uint8_t* const* dst = nullptr;
  uint32_t num_tensors = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  CodecKind codec = CodecKind::kInt8Kivi;
  Role role = Role::kKey;
  KvDtype src_dtype = KvDtype::kBf16;
};

struct DequantizeParams {
  // [num_tensors] device arrays of device pointers: what Quantize wrote, and [rows][cols] outputs.
  const uint8_t* const* src = nullptr;
  void* const* dst = nullptr;
  uint32_t num_tensors = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  CodecKind codec = CodecKind::kInt8Kivi;
  Role role = Role::kKey;
  KvDtype dst_dtype = KvDtype::kBf16;
};

cudaError_t QuantizePages(const QuantizeParams& p, cudaStream_t stream);
cudaError_t DequantizePages(const DequantizeParams& p, cudaStream_t stream);

// Copies num_blocks blocks of `block_bytes` each from src[i] to dst[i]: a page gather (scattered
// pages into one contiguous buffer before a single DMA) or scatter (the reverse), in one launch.
// Pointers may be device memory or mapped pinned host memory (zero-copy reads over the bus).
// REQUIRES: block_bytes and every pointer 16-byte aligned; blocks do not overlap.
struct PageCopyParams {
  const void* const* src = nullptr;  // [num_blocks], device array
  void* const* dst = nullptr;        // [num_blocks], device array
  uint32_t num_blocks = 0;
  uint64_t block_bytes = 0;
};

cudaError_t CopyPages(const PageCopyParams& p, cudaStream_t stream);

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_KV_OPS_H_
