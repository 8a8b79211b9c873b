#include "engine/forward_pass.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvtier::engine {
namespace {

// The CPU engine as a ForwardPass.
class CpuPass final : public ForwardPass {
 public:
  explicit CpuPass(Model& model) : model_(model) {}
  Device device() const override { return Device::kCpu; }
  const ModelConfig& config() const override { return model_.config(); }
  absl::Status Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                       std::vector<float>* last_logits) override {
    return model_.Prefill(tokens, cache, last_logits);
  }
  absl::Status Decode(std::span<const DecodeRequest> batch) override {
    return model_.Decode(batch);
  }

 private:
  Model& model_;
};

}  // namespace

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--device '", std::string(name), "' is not one of: cpu, cuda"));
}

const char* DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

std::unique_ptr<ForwardPass> CpuForwardPass(Model& model) {
  return std::make_unique<CpuPass>(model);
}

}  // namespace kvtier::engine
