#ifndef KVTIER_ENGINE_CUDA_HOST_WEIGHTS_H_
#define KVTIER_ENGINE_CUDA_HOST_WEIGHTS_H_

// The reference model's weights as the CUDA engine uploads them: every matrix dequantized once
// from its GGUF type (Q4_1, Q8_0, ... through the CPU engine's DequantizeRow) to IEEE f16, round
// to nearest even; matrices one GEMM serves are stacked (Q|K|V, gate|up); norms stay f32.
// Host-only, no CUDA: built and unit-tested everywhere. Pure functions, thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/model.h"

namespace kvtier::engine::cuda {

// Row-major [rows][cols] f16 values (bits). cols is the input dimension (GGUF ne[0]).
struct HalfMatrix {
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint16_t> values;
};

struct HostLayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  HalfMatrix qkv;      // attn_q, attn_k, attn_v rows: [q_dim + 2 kv_dim][hidden]
  HalfMatrix wo;       // [hidden][q_dim]
  HalfMatrix gate_up;  // ffn_gate rows, then ffn_up rows: [2 ffn][hidden]
  HalfMatrix down;     // [hidden][ffn]
};

struct HostWeights {
  HalfMatrix token_embd;  // [vocab][hidden]; the output matrix too when embeddings are tied
  HalfMatrix output;      // [vocab][hidden]; empty when tied
  std::vector<float> output_norm;
  std::vector<HostLayerWeights> layers;

  // Bytes the weights take once uploaded.
  uint64_t Bytes() const;
};

// One GGUF matrix (2 dims) dequantized to f16. INVALID_ARGUMENT naming the tensor and its type
// when it is not a matrix or a value does not fit f16 (NaN, Inf, |x| > 65504).
absl::StatusOr<HalfMatrix> DequantizeToHalf(const GgufTensorInfo& tensor);

// Every weight of `model` (which Load already validated: names, shapes, f32 norms).
absl::StatusOr<HostWeights> DequantizeWeights(const Model& model);

}  // namespace kvtier::engine::cuda

#endif  // KVTIER_ENGINE_CUDA_HOST_WEIGHTS_H_
