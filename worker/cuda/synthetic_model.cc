#include "worker/cuda/synthetic_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_status.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::worker::cuda {

namespace kc = kernels::cuda;

absl::Status SyntheticModelConfig::Validate() const {
  if (num_layers == 0 || num_q_heads == 0 || num_kv_heads == 0 || hidden == 0 || ffn == 0 ||
      vocab == 0) {
    return absl::InvalidArgumentError("num_layers, heads, hidden, ffn and vocab must be > 0");
  }
  if (head_dim != 64 && head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim must be 64 or 128, got ", head_dim));
  }
  if (num_q_heads % num_kv_heads != 0 || num_q_heads / num_kv_heads > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_q_heads / num_kv_heads must be an integer <= 8, got ", num_q_heads, " / ",
                     num_kv_heads));
  }
  if (!(rope_base > 0.f) || !(rms_eps > 0.f)) {
    return absl::InvalidArgumentError("rope_base and rms_eps must be > 0");
  }
  return absl::OkStatus();
}

uint64_t SyntheticModelConfig::ParameterCount() const {
  const uint64_t h = hidden;
  const uint64_t per_layer = 2 * h + uint64_t{QkvRows()} * h + h * num_q_heads * head_dim +
                             2 * uint64_t{ffn} * h + h * ffn;
  return per_layer * num_layers + 2 * uint64_t{vocab} * h + h;
}

absl::StatusOr<std::unique_ptr<SyntheticModel>> SyntheticModel::Create(
    const SyntheticModelConfig& config) {
  absl::Status valid = config.Validate();
  if (!valid.ok()) return valid;
  std::unique_ptr<SyntheticModel> m(new SyntheticModel(config));
  absl::Status s = m->Init();
  if (!s.ok()) return s;
  return m;
}

SyntheticModel::~SyntheticModel() { cudaFree(memory_); }

absl::Status SyntheticModel::Init() {
  const SyntheticModelConfig& c = config_;
  bytes_ = 2 * c.ParameterCount();
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&memory_, bytes_));
  uint16_t* cursor = memory_;
  uint64_t tensor = 0;
  // Uniform in [-a, a] with a = sqrt(3 / fan_in): unit-variance rows keep activations bounded.
  auto take = [&](uint64_t n, float fan_in, bool ones) -> absl::StatusOr<uint16_t*> {
    uint16_t* t = cursor;
    cursor += n;
    const cudaError_t e =
        ones ? kc::FillConstBf16(t, n, 1.f, nullptr)
             : kc::FillHashBf16(t, n, c.seed * 1000003 + tensor, std::sqrt(3.f / fan_in), nullptr);
    ++tensor;
    if (e != cudaSuccess) return CudaStatus(e, "filling weights");
    return t;
  };
  const float h = static_cast<float>(c.hidden);
  layers_.resize(c.num_layers);
  for (LayerWeights& w : layers_) {
    absl::StatusOr<uint16_t*> t;
    if (!(t = take(c.hidden, 1, true)).ok()) return t.status();
    w.attn_norm = *t;
    if (!(t = take(uint64_t{c.QkvRows()} * c.hidden, h, false)).ok()) return t.status();
    w.w_qkv = *t;
    if (!(t = take(uint64_t{c.hidden} * c.num_q_heads * c.head_dim,
                   static_cast<float>(c.num_q_heads * c.head_dim), false))
             .ok()) {
      return t.status();
    }
    w.w_o = *t;
    if (!(t = take(c.hidden, 1, true)).ok()) return t.status();
    w.mlp_norm = *t;
    if (!(t = take(2 * uint64_t{c.ffn} * c.hidden, h, false)).ok()) return t.status();
    w.w_gate_up = *t;
    if (!(t = take(uint64_t{c.hidden} * c.ffn, static_cast<float>(c.ffn), false)).ok()) {
      return t.status();
    }
    w.w_down = *t;
  }
  absl::StatusOr<uint16_t*> t = take(uint64_t{c.vocab} * c.hidden, 3.f, false);  // U(-1, 1)
  if (!t.ok()) return t.status();
  embedding_ = *t;
  if (!(t = take(c.hidden, 1, true)).ok()) return t.status();
  final_norm_ = *t;
  if (!(t = take(uint64_t{c.vocab} * c.hidden, h, false)).ok()) return t.status();
  lm_head_ = *t;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

}  // namespace kvtier::worker::cuda
