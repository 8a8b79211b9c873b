#ifndef KVTIER_ENGINE_FORWARD_PASS_H_
#define KVTIER_ENGINE_FORWARD_PASS_H_

// A model's forward pass on one device, as kvtier-run drives it: the CPU engine (Model) or the
// CUDA one (engine/cuda/cuda_model.h). Caches are worker::AttentionCache; on kCuda they take
// device pointers (a runtime built with StoreBackend::kCuda on the pass's stream).

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "worker/attention_cache.h"

namespace kvtier::engine {

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

// "cpu" | "cuda"; INVALID_ARGUMENT naming --device and the value otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view name);
const char* DeviceName(Device device);

// Thread-compatible: one forward call at a time.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;

  virtual Device device() const = 0;
  // kCuda: the compute stream (a cudaStream_t) the caches must enqueue on; null on kCpu.
  virtual void* cuda_stream() const { return nullptr; }
  virtual const ModelConfig& config() const = 0;

  // As Model::Prefill and Model::Decode (position_mass: CPU only).
  virtual absl::Status Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                               std::vector<float>* last_logits) = 0;
  virtual absl::Status Decode(std::span<const DecodeRequest> batch) = 0;
};

// The CPU engine as a ForwardPass (`model` outlives it).
std::unique_ptr<ForwardPass> CpuForwardPass(Model& model);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_FORWARD_PASS_H_
