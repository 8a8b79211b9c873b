#include "worker/cuda/copy_engine.h"

#include "worker/cuda/cuda_status.h"

namespace kvtier::worker::cuda {
namespace {

// base + offset as an address; a null base makes offsets absolute addresses.
inline void* At(const uint8_t* base, uint64_t offset) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base) + offset);
}

}  // namespace

absl::Status CopyIssuer::Issue(absl::Span<const CopyRun> runs, const uint8_t* src_base,
                               uint8_t* dst_base, cudaStream_t stream) {
  if (runs.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 12080
  if (runs.size() > 1 && !batch_refused_) {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (const CopyRun& r : runs) {
      dsts_.push_back(At(dst_base, r.dst_offset));
      srcs_.push_back(At(src_base, r.src_offset));
      sizes_.push_back(r.bytes);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t e = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(),
                                               runs.size(), &attr, &attr_index, 1, stream);
#else  // 12.8 and 12.9 report the failing index
    size_t fail_index = 0;
    const cudaError_t e =
        cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), runs.size(), &attr,
                             &attr_index, 1, &fail_index, stream);
#endif
    if (e == cudaSuccess) {
      ++batched_calls_;
      ++calls_;
      descriptors_ += runs.size();
      return absl::OkStatus();
    }
    // Older drivers or unsupported memory: clear the error and fall back for good.
    cudaGetLastError();
    batch_refused_ = true;
  }
#endif
  for (const CopyRun& r : runs) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(At(dst_base, r.dst_offset),
                                                At(src_base, r.src_offset), r.bytes,
                                                cudaMemcpyDefault, stream));
    ++calls_;
    ++descriptors_;
  }
  return absl::OkStatus();
}

absl::Status CopyIssuer::Issue(absl::Span<const StridedRun> runs, const uint8_t* src_base,
                               uint8_t* dst_base, cudaStream_t stream) {
  plain_.clear();
  for (const StridedRun& r : runs) {
    if (r.rows == 1) {
      plain_.push_back({r.src_offset, r.dst_offset, r.bytes});
      continue;
    }
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(At(dst_base, r.dst_offset), r.dst_pitch,
                                                  At(src_base, r.src_offset), r.src_pitch, r.bytes,
                                                  r.rows, cudaMemcpyDefault, stream));
    ++pitched_calls_;
    ++calls_;
    ++descriptors_;
  }
  return Issue(absl::Span<const CopyRun>(plain_), src_base, dst_base, stream);
}

}  // namespace kvtier::worker::cuda
