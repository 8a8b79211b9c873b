#ifndef KVTIER_BENCH_GPU_DECODE_BENCH_H_
#define KVTIER_BENCH_GPU_DECODE_BENCH_H_

// Decode throughput of the synthetic model, `full` against `hierarchy`, timed with CUDA events.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_decoder.h"

namespace kvtier::bench {

struct DecodeResult {
  uint32_t batch = 0;
  worker::cuda::KvMode mode = worker::cuda::KvMode::kFull;
  double step_ms = 0;
  double tokens_per_s = 0;
  uint64_t t1_bytes_per_step = 0;
  worker::cuda::DecoderStats stats;
  std::vector<float> logits;  // after the last step, for bit-identity checks
};

// Runs `warmup` untimed then `steps` timed decode steps of a fresh decoder (its KV cache in the
// tiered store over the CUDA backend, local mode: the T1 pool is the runtime's, pinned).
absl::StatusOr<DecodeResult> RunDecode(const worker::cuda::SyntheticModel& model,
                                       const worker::cuda::DecoderOptions& options, int warmup,
                                       int steps);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_GPU_DECODE_BENCH_H_
