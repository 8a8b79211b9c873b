#ifndef KVTIER_WORKER_CUDA_GPU_DECODER_H_
#define KVTIER_WORKER_CUDA_GPU_DECODER_H_

// Batched greedy decoding of a SyntheticModel on the GPU, its KV cache in the worker's tiered
// store: one local-mode WorkerRuntime on the CUDA backend and one TieredSequence per batch row
// (decoder_config.h). The decoder owns only the model's compute (cuBLAS GEMMs, the model_ops
// kernels); placement, plans, staging and scores are the store's, the same code every backend
// and the daemon run.
//
// Each sequence starts with a chain of `context_tokens` hash-filled KV (the same values in every
// mode), written into T0, then grows by one token per Step(). Every layer of a step: the batched
// QKV projection and RoPE give each sequence its K, V and query rows, which go through the
// sequence's Append and one batched Attend (the paged decode kernel over every sequence's T0
// blocks and T1 pages staged one layer ahead on the backends' copy streams). After each forward
// pass the sequence re-tiers every retier_interval steps, from the end of step 0 on: the policy
// (`full`, or `hierarchy` with the decoder's budgets) decides on the cumulative scores the kernel
// accumulated on the device, and the plan is applied by the store (pages leave T0 only by plans).
// So `full` and `hierarchy` with r = 0 give bit-identical logits by construction.
//
// KV is bf16 by default (DecoderOptions::bf16_kv: the store rounds the f32 rows RoPE writes),
// f32 if asked. Attention is one launch per layer for the whole batch
// (TieredSequence::AttendBatch); appends are two row writes per sequence.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/cublas_api.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/decoder_config.h"
#include "worker/cuda/synthetic_model.h"
#include "worker/runtime/tiered_sequence.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker::cuda {

// Sums over the batch.
struct DecoderStats {
  uint64_t t0_pages = 0;  // pages now in each tier, every sequence together
  uint64_t t1_pages = 0;
  uint64_t evicted_pages = 0;
  uint64_t arena_bytes = 0;  // in use in the device arena: T0 pages and the stores' working memory
  uint64_t t1_pool_bytes = 0;               // host bytes holding T1 pages now
  uint64_t last_step_h2d_bytes = 0;         // staging bytes issued by the last Step()
  uint64_t last_step_copy_calls = 0;        // staging copy calls of the last Step()
  uint64_t last_step_copy_descriptors = 0;  // and the copies (DMA descriptors) they carried
  uint64_t batched_calls = 0;               // staging calls through cudaMemcpyBatchAsync so far
  uint64_t offload_d2h_bytes = 0;           // T0 -> T1 bytes moved by plans so far
  uint64_t promote_h2d_bytes = 0;           // T1 -> T0 bytes moved by plans so far
  uint64_t plans = 0;                       // plans applied, every sequence together
};

// Not thread-safe: one host thread drives it. The model outlives it.
class GpuDecoder {
 public:
  // INVALID_ARGUMENT naming the field for bad options (MakeDecoderConfig) or a model shape the
  // CUDA store refuses; FAILED_PRECONDITION without a CUDA device.
  static absl::StatusOr<std::unique_ptr<GpuDecoder>> Create(const SyntheticModel& model,
                                                            const DecoderOptions& options);
  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  // Enqueues one decode step for every sequence on stream(); tokens stay on the device. A
  // re-tiering step waits for the scores and applies its plans before returning.
  // OUT_OF_RANGE past max_new_tokens.
  absl::Status Step();
  // Wait for the stream, then copy [batch][vocab] logits / [batch] next tokens of the last step.
  absl::Status ReadLogits(std::vector<float>* out);
  absl::Status ReadTokens(std::vector<int32_t>* out);
  absl::Status Sync();

  cudaStream_t stream() const { return stream_; }
  uint32_t steps_done() const { return steps_; }
  // Counted now (placement, pools) and by the last Step().
  DecoderStats stats() const;
  const TieredSequence& sequence(uint32_t b) const { return *sequences_[b]; }
  const DecoderConfig& config() const { return config_; }

 private:
  GpuDecoder(const SyntheticModel& model, const DecoderOptions& options, DecoderConfig config)
      : model_(model), options_(options), config_(std::move(config)) {}
  absl::Status Init();
  absl::Status AllocateBuffers();
  absl::Status FillContext();
  absl::Status Layer(uint32_t l);
  absl::Status Gemm(const uint16_t* w, uint32_t out, uint32_t in, const uint16_t* x, float* y);
  // Staging totals of every sequence's store so far.
  struct Staging {
    uint64_t bytes = 0, calls = 0, descriptors = 0, batched = 0;
  };
  Staging StagingTotals() const;

  const SyntheticModel& model_;
  const DecoderOptions options_;
  DecoderConfig config_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // Declared before the buffers' users: the sequences go before the runtime they came from.
  std::unique_ptr<WorkerRuntime> runtime_;
  std::vector<std::unique_ptr<TieredSequence>> sequences_;
  std::vector<TieredSequence*> batch_;  // sequences_, for AttendBatch
  Staging last_step_;                   // staging of the last Step()
  uint32_t steps_ = 0;
  // Device buffers.
  int32_t* positions_dev_ = nullptr;
  int32_t* tokens_dev_ = nullptr;
  float* x_ = nullptr;       // [batch][hidden] residual stream
  uint16_t* xn_ = nullptr;   // [batch][max(hidden, ffn, q_dim)] bf16 activations
  float* qkv_ = nullptr;     // [batch][qkv rows]
  float* q_ = nullptr;       // [batch][q heads][head_dim]
  float* k_ = nullptr;       // [batch][kv heads][head_dim] (the context fill: [context][...])
  float* v_ = nullptr;       // the same
  float* attn_ = nullptr;    // [batch][q heads][head_dim]
  float* tmp_ = nullptr;     // [batch][hidden]
  float* gu_ = nullptr;      // [batch][2 ffn]
  float* logits_ = nullptr;  // [batch][vocab]
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_GPU_DECODER_H_
