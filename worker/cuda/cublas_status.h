#ifndef KVTIER_WORKER_CUDA_CUBLAS_STATUS_H_
#define KVTIER_WORKER_CUDA_CUBLAS_STATUS_H_

// cuBLAS errors to absl::Status, at the edge (style rule 3).

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/cuda/cublas_api.h"

namespace kvtier::worker::cuda {

// OK for CUBLAS_STATUS_SUCCESS, else INTERNAL naming `what` and the status.
inline absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(s)));
}

}  // namespace kvtier::worker::cuda

// Returns the converted status of a cuBLAS call that did not succeed.
#define KVTIER_CUBLAS_RETURN_IF_ERROR(expr)                                 \
  do {                                                                      \
    const cublasStatus_t kvtier_cublas_s_ = (expr);                         \
    if (kvtier_cublas_s_ != CUBLAS_STATUS_SUCCESS) {                        \
      return ::kvtier::worker::cuda::CublasStatus(kvtier_cublas_s_, #expr); \
    }                                                                       \
  } while (0)

#endif  // KVTIER_WORKER_CUDA_CUBLAS_STATUS_H_
