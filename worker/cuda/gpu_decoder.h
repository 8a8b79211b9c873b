#ifndef KVTIER_WORKER_CUDA_GPU_DECODER_H_
#define KVTIER_WORKER_CUDA_GPU_DECODER_H_

// Batched greedy decoding of a SyntheticModel over a paged, tiered KV cache on the GPU: the
// engine path of the CUDA data plane.
//
// The cache holds a chain of `context_tokens` generated KV per sequence (hash-filled, the same
// values in every mode), then grows by one token per Step(). `full` keeps every page in the
// device arena (T0). `hierarchy` places pages with SplitPages (protected pages and the best
// candidates in T0 up to beta, r of the candidates evicted, the rest T1): T1 pages are offloaded
// to the pinned host pool at setup and, every step, copied back layer by layer into staging, one
// layer ahead on the copy stream, while the previous layer computes. Attention reads T0 pages and
// staged pages through one page table with the same kernel, so with r = 0 both modes produce
// bit-identical logits.
//
// Host pool layout (one layer's block per slot, per-layer placement groups with the same
// decision in every layer): slot(l, b, k) = ((l * batch + b) * max_t1_pages + k) * block_bytes,
// so one layer's T1 blocks are contiguous and a layer's prefetch is a few large DMAs. The
// write-back area follows: ((l * batch + b) * write_back_pages + j) * block_bytes past the T1
// area, j = page - context_tokens / page_tokens.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_device_arena.h"
#include "worker/cuda/layer_stager.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/cuda/placement_split.h"
#include "worker/cuda/synthetic_model.h"

namespace kvtier::worker::cuda {

enum class KvMode : uint8_t { kFull = 0, kHierarchy = 1 };

struct DecoderOptions {
  uint32_t batch = 1;
  uint32_t context_tokens = 2048;  // synthetic chain already cached per sequence
  uint32_t max_new_tokens = 64;    // steps the cache is sized for
  uint32_t page_tokens = 16;
  KvMode mode = KvMode::kFull;
  SplitKnobs split;  // hierarchy placement (beta, r, protected spans)
  uint32_t staging_slots = 2;
  bool emit_mass = true;  // accumulate per-position attention mass over layers (scoring input)
  // Hierarchy: when a page fills during decoding, copy its blocks to the T1 pool's write-back
  // area on the device-to-host stream, overlapping the next step (a page leaving the window is
  // then already in host memory when a plan demotes it).
  bool write_back = true;
  uint64_t kv_seed = 7;
};

struct DecoderStats {
  uint32_t t0_pages_per_seq = 0;  // of the context
  uint32_t t1_pages_per_seq = 0;
  uint32_t evicted_pages_per_seq = 0;
  uint64_t arena_bytes = 0;           // T0 bytes in use
  uint64_t t1_pool_bytes = 0;         // host bytes holding T1
  uint64_t last_step_h2d_bytes = 0;   // prefetch bytes issued by the last Step()
  uint64_t offload_d2h_bytes = 0;     // bytes offloaded at setup
  uint64_t write_back_d2h_bytes = 0;  // bytes written back during decoding
};

// Not thread-safe: one host thread drives it. The model and the pool mapping outlive it.
class GpuDecoder {
 public:
  // Host bytes the T1 pool must have for these options (0 in full mode).
  static absl::StatusOr<uint64_t> RequiredPoolBytes(const SyntheticModelConfig& model,
                                                    const DecoderOptions& options);
  // `t1_pool` is the host mapping T1 lives in (pinned on demand); may be null in full mode.
  static absl::StatusOr<std::unique_ptr<GpuDecoder>> Create(const SyntheticModel& model,
                                                            const DecoderOptions& options,
                                                            PinnedMapping* t1_pool);
  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  // Enqueues one decode step for every sequence on stream(); tokens stay on the device.
  // OUT_OF_RANGE past max_new_tokens.
  absl::Status Step();
  // Waits for the stream, then copies [batch][vocab] logits / [batch] next tokens /
  // [batch][context + max_new] mass of the last step.
  absl::Status ReadLogits(std::vector<float>* out);
  absl::Status ReadTokens(std::vector<int32_t>* out);
  absl::Status ReadMass(std::vector<float>* out);
  // Waits for the compute stream and every device-to-host copy issued so far.
  absl::Status Sync();
  // Host copy of layer `layer`'s block of sequence b's page `page`, which must be in T0.
  absl::Status ReadT0Block(uint32_t b, uint32_t page, uint32_t layer, std::vector<uint8_t>* out);
  // Pool offset of the write-back slot of (layer, sequence, page); pages from
  // context_tokens / page_tokens on have one.
  uint64_t WriteBackOffset(uint32_t layer, uint32_t b, uint32_t page) const;

  cudaStream_t stream() const { return stream_; }
  uint32_t steps_done() const { return steps_; }
  const DecoderStats& stats() const { return stats_; }
  uint64_t BlockBytes() const;

 private:
  GpuDecoder(const SyntheticModel& model, const DecoderOptions& options, PinnedMapping* pool)
      : model_(model), options_(options), pool_(pool) {}
  absl::Status Init();
  absl::Status AllocateBuffers();
  absl::Status PlaceAndFillCache();
  absl::Status BuildStageRequests();
  absl::Status UploadTables();
  absl::Status PrefetchLayer(uint32_t layer);
  absl::Status Layer(uint32_t l);
  absl::Status WriteBackFilledPage();
  absl::Status Gemm(const uint16_t* w, uint32_t out, uint32_t in, const uint16_t* x, float* y);

  const SyntheticModel& model_;
  const DecoderOptions options_;
  PinnedMapping* pool_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaDeviceArena> arena_;
  std::unique_ptr<LayerStager> stager_;
  uint32_t pages_per_seq_ = 0;
  uint32_t max_t1_pages_ = 0;
  std::vector<PageTier> tiers_;                       // [page], same for every sequence
  std::vector<uint8_t*> t0_pages_;                    // [batch * pages_per_seq], null if not T0
  std::vector<std::vector<const void*>> tables_;      // [layer][batch * pages_per_seq]
  std::vector<std::vector<StageRequest>> requests_;   // [layer]
  std::vector<std::vector<uint32_t>> request_index_;  // [layer] -> table index per request
  std::vector<bool> prefetched_;                      // [layer]: issued for the coming use
  uint64_t step_h2d_ = 0;
  uint32_t steps_ = 0;
  DecoderStats stats_;
  // Device buffers.
  void** tables_dev_ = nullptr;  // [layer][batch * pages_per_seq]
  int32_t* indptr_dev_ = nullptr;
  int32_t* positions_dev_ = nullptr;
  int32_t* lengths_dev_ = nullptr;
  int32_t* tokens_dev_ = nullptr;
  float* x_ = nullptr;       // [batch][hidden] residual stream
  uint16_t* xn_ = nullptr;   // [batch][max(hidden, ffn, q_dim)] bf16 activations
  float* qkv_ = nullptr;     // [batch][qkv rows]
  float* q_ = nullptr;       // [batch][q heads][head_dim]
  float* attn_ = nullptr;    // [batch][q heads][head_dim]
  float* tmp_ = nullptr;     // [batch][hidden]
  float* gu_ = nullptr;      // [batch][2 ffn]
  float* logits_ = nullptr;  // [batch][vocab]
  float* mass_ = nullptr;    // [batch][max length]
  void* workspace_ = nullptr;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_GPU_DECODER_H_
