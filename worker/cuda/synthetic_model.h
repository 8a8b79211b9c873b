#ifndef KVTIER_WORKER_CUDA_SYNTHETIC_MODEL_H_
#define KVTIER_WORKER_CUDA_SYNTHETIC_MODEL_H_

// A decoder-only transformer with generated weights, living on the GPU: the geometry of a real
// model (default: a 7B-class Qwen2-like shape) without a checkpoint, so the data plane can be
// measured at realistic sizes. Weights are bf16, drawn on the device from a counter hash (no
// host traffic); norms are 1. Not a language model: its tokens mean nothing, its cost is real.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_api.h"

namespace kvtier::worker::cuda {

struct SyntheticModelConfig {
  uint32_t num_layers = 28;
  uint32_t num_q_heads = 28;
  uint32_t num_kv_heads = 4;
  uint32_t head_dim = 128;
  uint32_t hidden = 3584;
  uint32_t ffn = 18944;
  uint32_t vocab = 152064;
  float rope_base = 1000000.f;
  float rms_eps = 1e-6f;
  uint64_t seed = 1;

  // 28 layers, 28 query heads, 4 KV heads, head_dim 128, hidden 3584, ffn 18944, vocab 152064.
  static SyntheticModelConfig SevenBClass() { return {}; }
  // INVALID_ARGUMENT naming the field (head_dim 64 or 128, group <= 8, non-zero sizes).
  absl::Status Validate() const;
  uint32_t QkvRows() const { return (num_q_heads + 2 * num_kv_heads) * head_dim; }
  uint64_t ParameterCount() const;
};

// bf16 tensors ([out][in] row-major for matrices), as uint16_t bits.
struct LayerWeights {
  const uint16_t* attn_norm = nullptr;  // [hidden]
  const uint16_t* w_qkv = nullptr;      // [QkvRows()][hidden]: q heads, k heads, v heads
  const uint16_t* w_o = nullptr;        // [hidden][num_q_heads * head_dim]
  const uint16_t* mlp_norm = nullptr;   // [hidden]
  const uint16_t* w_gate_up = nullptr;  // [2 * ffn][hidden]: gate rows then up rows
  const uint16_t* w_down = nullptr;     // [hidden][ffn]
};

// Immutable after Create; thread-safe to read. Owns one device allocation.
class SyntheticModel {
 public:
  // Allocates and fills the weights on the current device (waits for the fill).
  static absl::StatusOr<std::unique_ptr<SyntheticModel>> Create(const SyntheticModelConfig& config);
  ~SyntheticModel();
  SyntheticModel(const SyntheticModel&) = delete;
  SyntheticModel& operator=(const SyntheticModel&) = delete;

  const SyntheticModelConfig& config() const { return config_; }
  const LayerWeights& layer(uint32_t i) const { return layers_[i]; }
  const uint16_t* embedding() const { return embedding_; }  // [vocab][hidden]
  const uint16_t* final_norm() const { return final_norm_; }
  const uint16_t* lm_head() const { return lm_head_; }  // [vocab][hidden]
  uint64_t weight_bytes() const { return bytes_; }

 private:
  explicit SyntheticModel(const SyntheticModelConfig& config) : config_(config) {}
  absl::Status Init();

  SyntheticModelConfig config_;
  uint16_t* memory_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<LayerWeights> layers_;
  const uint16_t* embedding_ = nullptr;
  const uint16_t* final_norm_ = nullptr;
  const uint16_t* lm_head_ = nullptr;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_SYNTHETIC_MODEL_H_
