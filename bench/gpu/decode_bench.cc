#include "bench/gpu/decode_bench.h"

#include "worker/cuda/cuda_status.h"

namespace kvtier::bench {

using worker::cuda::GpuDecoder;

absl::StatusOr<DecodeResult> RunDecode(const worker::cuda::SyntheticModel& model,
                                       const worker::cuda::DecoderOptions& options, int warmup,
                                       int steps) {
  absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(model, options);
  if (!d.ok()) return d.status();
  for (int i = 0; i < warmup; ++i) {
    absl::Status s = (*d)->Step();
    if (!s.ok()) return s;
  }
  cudaEvent_t a, b;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(a, (*d)->stream()));
  uint64_t h2d = 0;
  for (int i = 0; i < steps; ++i) {
    absl::Status s = (*d)->Step();
    if (!s.ok()) return s;
    h2d += (*d)->stats().last_step_h2d_bytes;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(b, (*d)->stream()));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b));
  float ms = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  DecodeResult r;
  r.batch = options.batch;
  r.mode = options.mode;
  r.step_ms = ms / steps;
  r.tokens_per_s = options.batch * steps / (ms * 1e-3);
  r.t1_bytes_per_step = steps > 0 ? h2d / steps : 0;
  r.stats = (*d)->stats();
  absl::Status s = (*d)->ReadLogits(&r.logits);
  if (!s.ok()) return s;
  return r;
}

}  // namespace kvtier::bench
