#ifndef KVTIER_ENGINE_CLI_OPEN_DEVICE_H_
#define KVTIER_ENGINE_CLI_OPEN_DEVICE_H_

// `--device`: the forward pass kvtier-run uses, CPU or CUDA (when this build has the CUDA engine).

#include <memory>

#include "absl/status/statusor.h"
#include "engine/forward_pass.h"
#include "engine/model.h"

namespace kvtier::engine {

// Whether this build has the CUDA engine (a CUDA toolkit at configure time).
bool BuiltWithCudaEngine();

// The forward pass of `model` on `device` (the model outlives it). kCuda: FAILED_PRECONDITION
// naming --device and why when kvtier was built without CUDA or no device can be used.
absl::StatusOr<std::unique_ptr<ForwardPass>> OpenForwardPass(Model& model, Device device);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_CLI_OPEN_DEVICE_H_
