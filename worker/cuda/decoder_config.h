#ifndef KVTIER_WORKER_CUDA_DECODER_CONFIG_H_
#define KVTIER_WORKER_CUDA_DECODER_CONFIG_H_

// What the synthetic GPU decoder (gpu_decoder.h) asks of the worker library: one local-mode
// WorkerRuntime on the CUDA backend and one TieredSequence per batch row, with the policy the
// daemon would run (`full`, or `hierarchy` with the decoder's budgets). Placement, plans and
// staging are the store's; this file only turns the decoder's knobs into the library's options
// and sizes the memory. Pure host logic, no CUDA: unit-tested on every build.

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/attention_cache.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker::cuda {

enum class KvMode : uint8_t { kFull = 0, kHierarchy = 1 };

// `hierarchy` budgets and protected spans (DESIGN.md section 2), as the daemon takes them.
struct DecoderTiering {
  double hbm_ratio = 0.5;     // beta
  double evict_ratio = 0.03;  // r
  uint32_t prompt_tokens = 128;
  uint32_t sink_tokens = 4;
  uint32_t window_tokens = 128;
  uint32_t retier_interval = 64;  // decode steps between re-tierings (the first: after step 0)
};

struct DecoderOptions {
  uint32_t batch = 1;
  uint32_t context_tokens = 2048;  // synthetic chain already cached per sequence
  uint32_t max_new_tokens = 64;    // steps the memory is sized for
  uint32_t page_tokens = 16;
  KvMode mode = KvMode::kFull;
  DecoderTiering tiering;  // read in hierarchy mode
  // KV stored as bf16 (the CUDA store rounds the f32 rows); false = f32, twice the bytes.
  bool bf16_kv = true;
  uint64_t kv_seed = 7;
};

// The library options of one decoder.
struct DecoderConfig {
  RuntimeOptions runtime;  // local mode, StoreBackend::kCuda; cuda_stream left to the caller
  SequenceOptions sequence;
  uint64_t pages_per_sequence = 0;  // pages of context + max_new tokens
  uint64_t page_bytes = 0;          // one page of every layer (K and V, bf16 or f32)
  layout::KvGeometry geometry;      // the stores'
};

// INVALID_ARGUMENT naming the field and its value for a batch outside [1, 1024], a zero
// context_tokens / max_new_tokens / page_tokens, a context + max_new_tokens past 2^31, a
// budget the policy refuses (tiering.hbm_ratio 1.5, ...) or a shape the store refuses. The
// arena holds every page of every sequence (the chain is written into T0 before the first
// re-tiering moves any of it; the CUDA stores' working memory is added by GpuDecoder, which
// knows the backend), the T1 pool every page the policy could offload. In full mode
// the tiering knobs are not read (no budget applies).
absl::StatusOr<DecoderConfig> MakeDecoderConfig(const AttentionShape& shape,
                                                const DecoderOptions& options);

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_DECODER_CONFIG_H_
