#ifndef KVTIER_WORKER_CUDA_COPY_ENGINE_H_
#define KVTIER_WORKER_CUDA_COPY_ENGINE_H_

// Issues a list of byte runs as asynchronous DMA on one stream: one cudaMemcpyBatchAsync call
// where the runtime has it (CUDA >= 12.8), else one cudaMemcpyAsync per run; strided runs as
// one cudaMemcpy2DAsync each (one pitched DMA, one descriptor, however many rows).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/staging_plan.h"

namespace kvtier::worker::cuda {

// Not thread-safe: one per stream. Keeps its argument vectors between calls (no allocation in
// steady state).
class CopyIssuer {
 public:
  // Copies runs[i]: src_base + src_offset -> dst_base + dst_offset, bytes. Host memory must be
  // pinned for the copies to be asynchronous. A null base makes that side's offsets addresses.
  absl::Status Issue(absl::Span<const CopyRun> runs, const uint8_t* src_base, uint8_t* dst_base,
                     cudaStream_t stream);
  // The same for strided runs: every one-row run in one batch as above, every other run one
  // pitched copy.
  absl::Status Issue(absl::Span<const StridedRun> runs, const uint8_t* src_base, uint8_t* dst_base,
                     cudaStream_t stream);

  // Calls issued through the batch API (0 when it is unavailable or refused).
  uint64_t batched_calls() const { return batched_calls_; }
  uint64_t pitched_calls() const { return pitched_calls_; }
  // Every copy call issued, and the descriptors (copies) they carried.
  uint64_t calls() const { return calls_; }
  uint64_t descriptors() const { return descriptors_; }

 private:
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  std::vector<CopyRun> plain_;
  bool batch_refused_ = false;
  uint64_t batched_calls_ = 0;
  uint64_t pitched_calls_ = 0;
  uint64_t calls_ = 0;
  uint64_t descriptors_ = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_COPY_ENGINE_H_
