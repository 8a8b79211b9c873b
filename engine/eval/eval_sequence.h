#ifndef KVTIER_ENGINE_EVAL_EVAL_SEQUENCE_H_
#define KVTIER_ENGINE_EVAL_EVAL_SEQUENCE_H_

// One configuration's sequence in the evaluation: the cache the model attends through, and the
// hooks that let a policy act between forward passes.
//   hierarchy / full      kvtier's own runtime (TieredSequence): re-tiers itself every Δ steps.
//   h2o, streaming, rkv   a TieredKvStore with a per-(layer, kv head) keep mask; the driver
//                         keeps ceil(β × length) positions per (layer, kv head) at prefill end
//                         and every Δ decode steps (h2o: cumulative per-head scores updated every
//                         step; rkv: attention of the last α = 8 queries and the keys).
//   snapkv                the same mask store; at prefill end the last 32 prompt queries vote
//                         (max-pooled) and ceil(β × length) positions per (layer, kv head)
//                         are kept, once: positions written later are kept.
//   arkv                  a TieredKvStore with one layer group per layer; ArkvDecide's
//                         placement (T0 / T2 / T3 per layer page) applied as plans.
// Not thread-safe: one decode loop drives a sequence.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/eval/grid.h"
#include "engine/eval/head_probe.h"
#include "worker/attention_cache.h"
#include "worker/device_arena.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {

// What a configuration cost over its sequence. Bytes are f32 KV (the CPU backend's precision).
struct EvalCost {
  double evicted_generated_fraction = 0;  // cumulative, of generated (position, layer, kv head)
  double t0_peak_bytes = 0, t0_mean_bytes = 0;      // over forward passes
  double full_peak_bytes = 0, full_mean_bytes = 0;  // what `full` holds over the same passes
  double t0_now_bytes = 0, full_now_bytes = 0;      // after the last forward pass
  double evicted_fraction = 0;                   // now, of all (position, layer, kv head) entries
  uint64_t ddr_bytes = 0, compressed_bytes = 0;  // held at the end
  uint64_t offload_bytes = 0, compress_bytes = 0, promote_bytes = 0, decompress_bytes = 0;
  double tier_seconds = 0;    // deciding and applying placements / masks, per-head scoring
  double lost_mass_peak = 0;  // hierarchy: the guardrail's peak (SequenceReport::lost_mass_peak)
};

class EvalSequence {
 public:
  virtual ~EvalSequence() = default;
  virtual worker::AttentionCache& cache() = 0;
  // After the prompt's forward pass / after each decode forward pass.
  virtual absl::Status AfterPrefill() = 0;
  virtual absl::Status AfterStep() = 0;
  // Between turns of a conversation: re-tier (or re-select what is kept) now.
  virtual absl::Status BetweenTurns() = 0;
  virtual EvalCost Cost() const = 0;
};

struct EvalSequenceOptions {
  uint32_t page_tokens = 16;
  uint32_t retier_interval = 64;  // Δ
  uint32_t window_tokens = 128;   // hierarchy's protected recent window
  uint32_t sink_tokens = 4;       // hierarchy's sinks (first generated positions)
  bool protect_prompt = true;     // hierarchy: the prompt (from protected_prompt_begin) in T0
};

// Memory and runtimes shared by the sequences of one evaluation worker, and the baselines'
// rows shared while their probes hold one fan-out prefill (open one context per prompt).
// Not thread-safe.
class EvalContext {
 public:
  EvalContext(const worker::AttentionShape& shape, const EvalSequenceOptions& options)
      : shape_(shape), options_(options) {}

  // `config` with policy "full" is the reference. INVALID_ARGUMENT for an unknown policy.
  // `protected_prompt_begin`: with protect_prompt, the first protected prompt position (the
  // start of the last user turn protects that turn only).
  absl::StatusOr<std::unique_ptr<EvalSequence>> Open(const EvalConfig& config,
                                                     uint64_t prompt_tokens,
                                                     uint64_t protected_prompt_begin = 0);

 private:
  absl::StatusOr<worker::WorkerRuntime*> Runtime(const std::string& codec);

  worker::AttentionShape shape_;
  EvalSequenceOptions options_;
  std::map<std::string, std::unique_ptr<worker::WorkerRuntime>> runtimes_;
  worker::HostArena arena_{64ull << 30};
  SharedProbeRows shared_rows_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_EVAL_SEQUENCE_H_
