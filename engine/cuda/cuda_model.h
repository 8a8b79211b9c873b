#ifndef KVTIER_ENGINE_CUDA_CUDA_MODEL_H_
#define KVTIER_ENGINE_CUDA_CUDA_MODEL_H_

// The reference engine's forward pass on a CUDA device. Weights are dequantized once from the
// GGUF to f16 (host_weights.h) and uploaded; every matrix product is a cuBLAS GEMM with f16
// inputs and f32 accumulation and output; the residual stream, Q/K/V, attention and logits are
// f32. Attention goes through worker::AttentionCache with DEVICE pointers (a runtime built with
// StoreBackend::kCuda and this model's stream): Append(k, v) and Attend(q, out) are called once
// per layer per sequence, n > 1 in a prefill. A forward call enqueues everything on the model's
// stream and synchronizes once at its end, when the logits come back to the host.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/host_weights.h"
#include "engine/forward_pass.h"
#include "engine/model.h"
#include "worker/cuda/cublas_api.h"
#include "worker/cuda/cuda_api.h"

namespace kvtier::engine::cuda {

struct CudaModelOptions {
  int device = 0;  // CUDA device ordinal
};

// Not thread-safe: one host thread drives it. Immutable weights; the workspace grows with the
// largest pass seen.
class CudaModel final : public ForwardPass {
 public:
  // Checks the device (FAILED_PRECONDITION "no CUDA device: <error>"), dequantizes and uploads
  // the weights of `model` (which must outlive this object: its config is shared).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const Model& model,
                                                           const CudaModelOptions& options = {});
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  Device device() const override { return Device::kCuda; }
  void* cuda_stream() const override { return stream_; }
  const ModelConfig& config() const override { return model_.config(); }
  uint64_t weight_bytes() const { return weight_bytes_; }

  // As Model::Prefill / Model::Decode; DecodeRequest::position_mass must be null (the CUDA
  // store scores on the device), INVALID_ARGUMENT otherwise.
  absl::Status Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                       std::vector<float>* last_logits) override;
  absl::Status Decode(std::span<const DecodeRequest> batch) override;

 private:
  struct Matrix {
    const uint16_t* data = nullptr;  // device, row-major [rows][cols] f16
    uint32_t rows = 0, cols = 0;
  };
  struct Segment {
    std::span<const int32_t> tokens;
    worker::AttentionCache* cache = nullptr;
    std::vector<float>* logits = nullptr;
  };
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    Matrix qkv, wo, gate_up, down;
  };
  // Device buffers of one pass, carved from one allocation.
  struct Workspace {
    int32_t* tokens = nullptr;     // [tokens]
    int32_t* positions = nullptr;  // [tokens]
    float *x = nullptr, *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr;
    float *att = nullptr, *tmp = nullptr, *gu = nullptr, *logits = nullptr;
    uint16_t *xh = nullptr, *last = nullptr;
  };

  explicit CudaModel(const Model& model) : model_(model) {}
  absl::Status Init(const CudaModelOptions& options);
  absl::Status Upload(const HostWeights& w);
  absl::StatusOr<Matrix> UploadMatrix(const HalfMatrix& m);
  absl::StatusOr<const float*> UploadFloats(const std::vector<float>& v);
  absl::Status Reserve(size_t tokens, size_t logit_rows);
  absl::Status Gemm(const Matrix& w, const uint16_t* x, size_t n, float* y);
  absl::Status Forward(std::span<const Segment> segments);
  absl::Status RunLayer(uint32_t l, std::span<const Segment> segments,
                        std::span<const uint32_t> starts, size_t total);
  absl::Status Attention(uint32_t l, std::span<const Segment> segments,
                         std::span<const uint32_t> starts);
  // Enqueues the last-token logits of every segment that wants them, and their copy to the host.
  absl::Status Logits(std::span<const Segment> segments);

  const Model& model_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<void*> allocations_;  // weights (device), freed at destruction
  uint64_t weight_bytes_ = 0;
  Matrix token_embd_, output_;
  const float* output_norm_ = nullptr;
  const double* inv_freq_ = nullptr;
  std::vector<Layer> layers_;
  void* workspace_block_ = nullptr;
  size_t workspace_tokens_ = 0, workspace_rows_ = 0;
  Workspace ws_;
  int32_t* host_ids_ = nullptr;   // pinned: [2][workspace_tokens_] ids then positions
  float* host_logits_ = nullptr;  // pinned: [workspace_rows_][vocab]
};

}  // namespace kvtier::engine::cuda

#endif  // KVTIER_ENGINE_CUDA_CUDA_MODEL_H_
