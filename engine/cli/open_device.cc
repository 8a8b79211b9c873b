#include "engine/cli/open_device.h"

#include "absl/strings/str_cat.h"

#ifdef KVTIER_HAVE_CUDA_ENGINE
#include "engine/cuda/cuda_model.h"
#endif

namespace kvtier::engine {

#ifdef KVTIER_HAVE_CUDA_ENGINE
bool BuiltWithCudaEngine() { return true; }
#else
bool BuiltWithCudaEngine() { return false; }
#endif

absl::StatusOr<std::unique_ptr<ForwardPass>> OpenForwardPass(Model& model, Device device) {
  if (device == Device::kCpu) return CpuForwardPass(model);
#ifdef KVTIER_HAVE_CUDA_ENGINE
  absl::StatusOr<std::unique_ptr<cuda::CudaModel>> gpu = cuda::CudaModel::Create(model);
  if (!gpu.ok()) {
    // Whatever the cause (no device, no driver, out of memory), the run cannot use the flag.
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", gpu.status().message()));
  }
  return std::unique_ptr<ForwardPass>(*std::move(gpu));
#else
  return absl::FailedPreconditionError(
      "--device cuda: kvtier was built without CUDA (configure with a CUDA toolkit, "
      "-DKVTIER_CUDA=ON)");
#endif
}

}  // namespace kvtier::engine
