#ifndef KVTIER_WORKER_CUDA_CUDA_STATUS_H_
#define KVTIER_WORKER_CUDA_CUDA_STATUS_H_

// CUDA runtime errors to absl::Status, at the edge (style rule 3).

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_api.h"

namespace kvtier::worker::cuda {

// OK for cudaSuccess. Out-of-memory -> RESOURCE_EXHAUSTED, invalid value -> INVALID_ARGUMENT,
// no device -> UNAVAILABLE, anything else -> INTERNAL; the message names `what` and the error.
// An error converted here is handled by the caller, so it is also cleared from the thread's
// last error: otherwise the next kernel launcher's cudaGetLastError would report it as its own.
inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Typed allocation helpers (cuda_runtime.h's templates need nvcc's headers; these do not).
template <typename T>
cudaError_t DeviceMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <typename T>
cudaError_t PinnedMalloc(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}

}  // namespace kvtier::worker::cuda

// Returns the converted status of a CUDA runtime call that did not succeed.
#define KVTIER_CUDA_RETURN_IF_ERROR(expr)                                 \
  do {                                                                    \
    const cudaError_t kvtier_cuda_err_ = (expr);                          \
    if (kvtier_cuda_err_ != cudaSuccess) {                                \
      return ::kvtier::worker::cuda::CudaStatus(kvtier_cuda_err_, #expr); \
    }                                                                     \
  } while (0)

#endif  // KVTIER_WORKER_CUDA_CUDA_STATUS_H_
