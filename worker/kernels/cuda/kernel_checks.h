#ifndef KVTIER_WORKER_KERNELS_CUDA_KERNEL_CHECKS_H_
#define KVTIER_WORKER_KERNELS_CUDA_KERNEL_CHECKS_H_

// The launchers' argument checks, shared by the CUDA kernels and their CPU references on the
// simulated device (worker/kernels/cuda/sim), so both refuse exactly the same launches.

#include "worker/kernels/cuda/kv_ops.h"
#include "worker/kernels/cuda/model_ops.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::kernels::cuda {

// What a launcher does with its arguments: refuse them (cudaErrorInvalidValue), return
// cudaSuccess with nothing to do, or launch.
enum class LaunchCheck { kInvalid, kNothing, kLaunch };
LaunchCheck CheckQuantize(const QuantizeParams& p);
LaunchCheck CheckDequantize(const DequantizeParams& p);
LaunchCheck CheckCopyPages(const PageCopyParams& p);

// Whether PagedDecodeAttention accepts p (cudaErrorInvalidValue otherwise).
bool ValidPagedDecode(const PagedDecodeParams& p);
// Whether RopeAppend accepts p.
bool ValidRopeAppend(const RopeAppendParams& p);
// Whether AccumulateScores accepts p.
bool ValidScoreAccumulate(const ScoreAccumulateParams& p);
// Whether MergeSplitAttention accepts p.
bool ValidSplitMerge(const SplitMergeParams& p);
bool ValidScoreBatch(const ScoreBatchParams& p);
// Chunks of kAttentionChunk positions covering max_length.
inline uint32_t AttentionChunks(uint32_t max_length) {
  return (max_length + kAttentionChunk - 1) / kAttentionChunk;
}

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_KERNEL_CHECKS_H_
