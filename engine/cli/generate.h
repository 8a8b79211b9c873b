#ifndef KVTIER_ENGINE_CLI_GENERATE_H_
#define KVTIER_ENGINE_CLI_GENERATE_H_

// `kvtier-run generate`: one prompt through the real model and the tiered cache.

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/forward_pass.h"
#include "engine/model.h"
#include "worker/runtime/tiered_sequence.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {

struct GenerateOptions {
  std::string prompt;
  bool chat = false;  // wrap the prompt in the model's ChatML template as a user message
  uint32_t max_new_tokens = 256;
  std::string policy = "hierarchy";
  double hbm_ratio = 0.5, evict_ratio = 0.0, compress_ratio = 0.0;
  double max_lost_mass = std::numeric_limits<double>::infinity();  // ε; inf = no limit
  uint32_t page_tokens = 16;
  // The protected set (DESIGN.md §2): sinks, recent window, the prompt (all | none |
  // last-turn: from the last "<|im_start|>user" on), and Δ.
  uint32_t sink_tokens = 4, window_tokens = 128, retier_interval = 64;
  std::string protect_prompt = "all";
  std::string codec = "int8_kivi";
  std::string daemon_address;  // "" = local pools
  // Daemon mode: the host link to declare for prefetch schedules (link_gbps 0 = none).
  double link_gbps = 0;
  std::string link_id;
  uint64_t staging_mib = 0;
  float temperature = 0.f;  // 0 = greedy
  float top_p = 1.f;
  uint64_t seed = 0;
  Device device = Device::kCpu;  // cuda: the CUDA engine over the store's CUDA backend
};

// The device half of a run: the forward pass and the runtime its sequences come from (on cuda,
// StoreBackend::kCuda on the pass's stream).
struct DeviceSetup {
  std::unique_ptr<ForwardPass> forward;
  std::unique_ptr<worker::WorkerRuntime> runtime;
};

struct GenerateResult {
  std::string text;             // generated text only
  std::vector<int32_t> tokens;  // generated ids
  uint64_t prompt_tokens = 0;
  worker::SequenceReport report;
  double prefill_seconds = 0, decode_seconds = 0;
  // Decode step times, p50 / p99 / max over the generated tokens (the token path: a slow daemon
  // must not show up here, DESIGN.md §6).
  double step_p50_ms = 0, step_p99_ms = 0, step_max_ms = 0;
  bool daemon_backed = false;
  std::string stop_reason;  // "eos" | "max_new_tokens" | "context"
};

// Opens the forward pass on options.device and the runtime. FAILED_PRECONDITION naming --device
// when this build or machine cannot serve it (no CUDA, no device, no CUDA store backend);
// UNAVAILABLE when kvtierd cannot be reached.
absl::StatusOr<DeviceSetup> SetUpDevice(Model& model, const GenerateOptions& options);

// Runs the prompt on `setup`; `on_text` (optional) receives each newly decoded piece of text as
// it is produced. INVALID_ARGUMENT naming the flag for impossible ratios or an empty prompt, or
// when the prompt does not fit the context.
absl::StatusOr<GenerateResult> Generate(Model& model, DeviceSetup& setup,
                                        const GenerateOptions& options,
                                        const std::function<void(const std::string&)>& on_text);
// SetUpDevice, then Generate.
absl::StatusOr<GenerateResult> Generate(Model& model, const GenerateOptions& options,
                                        const std::function<void(const std::string&)>& on_text);

// A readable tier report (several lines) and the machine-readable one.
std::string FormatReport(const GenerateResult& result, const GenerateOptions& options);
std::string ReportJson(const GenerateResult& result, const GenerateOptions& options);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_CLI_GENERATE_H_
