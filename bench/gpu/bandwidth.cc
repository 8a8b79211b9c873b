#include "bench/gpu/bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/cuda/copy_engine.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/cuda/shm_region.h"
#include "worker/cuda/staging_plan.h"

namespace kvtier::bench {
namespace {

using worker::cuda::CopyIssuer;
using worker::cuda::CopyRun;

// Median GB/s of `reps` timed runs of `issue` (which enqueues `bytes` of copies on `s`).
absl::StatusOr<double> Time(cudaStream_t s, uint64_t bytes, int reps,
                            const std::function<absl::Status()>& issue) {
  cudaEvent_t a, b;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
  std::vector<double> gbps;
  absl::Status status = issue();  // warm-up
  for (int r = 0; r < reps && status.ok(); ++r) {
    cudaEventRecord(a, s);
    status = issue();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    gbps.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!status.ok()) return status;
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace

absl::StatusOr<BandwidthResult> MeasureBandwidth(uint64_t bytes, int reps) {
  using worker::cuda::PinnedMapping;
  using worker::cuda::ShmRegion;
  BandwidthResult r;
  absl::StatusOr<std::unique_ptr<ShmRegion>> shm =
      ShmRegion::Create(absl::StrCat("/kvtier-bench-bw-", getpid()), bytes);
  r.pool_kind = "shm";
  if (!shm.ok()) {
    shm = ShmRegion::CreateAnonymous(bytes);
    r.pool_kind = "anonymous";
  }
  if (!shm.ok()) return shm.status();
  std::memset((*shm)->data(), 1, bytes);  // fault the pages in before timing the pinning
  const uint64_t chunk = uint64_t{256} << 20;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<PinnedMapping>> pool =
      PinnedMapping::Create((*shm)->data(), bytes, {.chunk_bytes = chunk, .pin_all_now = true});
  r.pin_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!pool.ok()) return pool.status();
  uint8_t* dev = nullptr;
  uint8_t* peak = nullptr;
  cudaStream_t s = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(worker::cuda::DeviceMalloc(&dev, bytes));
  KVTIER_CUDA_RETURN_IF_ERROR(worker::cuda::PinnedMalloc(&peak, bytes));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::memset(peak, 1, bytes);
  CopyIssuer issuer;
  const std::vector<CopyRun> whole = worker::cuda::CoalesceRuns({{0, 0, bytes}}, chunk);
  std::vector<CopyRun> blocks;
  for (uint64_t off = 0; off + 32768 <= bytes; off += 32768) {
    blocks.push_back({off, ((off / 32768) * 7919 % (bytes / 32768)) * 32768, 32768});
  }
  // The stager's pattern: layer l's 32 KiB block of each 28-layer page, a sequence's 64 pages
  // in consecutive slots one pitched copy.
  const uint64_t page = 28 * 32768, pages = bytes / page;
  std::vector<worker::cuda::StridedRun> pitched;
  uint64_t pitched_rows = 0;
  for (uint64_t l = 0; l < 28; ++l) {
    for (uint64_t first = 0; first < pages; first += 64) {
      std::vector<CopyRun> sequence;
      for (uint64_t p = first; p < std::min(pages, first + 64); ++p) {
        sequence.push_back({p * page + l * 32768, (l * pages + p) * 32768, 32768});
      }
      for (const auto& run : worker::cuda::GroupStrided(sequence, chunk)) pitched.push_back(run);
      pitched_rows += sequence.size();
    }
  }
  uint8_t* host = (*shm)->data();
  absl::StatusOr<double> v;
  auto h2d = [&] { return issuer.Issue(whole, host, dev, s); };
  auto d2h = [&] { return issuer.Issue(whole, dev, host, s); };
  auto h2d_blocks = [&] { return issuer.Issue(blocks, host, dev, s); };
  auto h2d_pitched = [&] {
    return issuer.Issue(absl::Span<const worker::cuda::StridedRun>(pitched), host, dev, s);
  };
  auto copy = [&](void* dst, const void* src) {
    return worker::cuda::CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s),
                                    "cudaMemcpyAsync");
  };
  absl::Status status;
  if ((v = Time(s, bytes, reps, h2d)).ok()) r.shm_h2d_gbps = *v;
  if (v.ok() && (v = Time(s, bytes, reps, d2h)).ok()) r.shm_d2h_gbps = *v;
  if (v.ok() && (v = Time(s, blocks.size() * 32768, reps, h2d_blocks)).ok()) {
    r.shm_h2d_blocks_gbps = *v;
  }
  if (v.ok() && (v = Time(s, pitched_rows * 32768, reps, h2d_pitched)).ok()) {
    r.shm_h2d_pitched_gbps = *v;
  }
  if (v.ok() && (v = Time(s, bytes, reps, [&] { return copy(dev, peak); })).ok()) {
    r.peak_h2d_gbps = *v;
  }
  if (v.ok() && (v = Time(s, bytes, reps, [&] { return copy(peak, dev); })).ok()) {
    r.peak_d2h_gbps = *v;
  }
  cudaStreamDestroy(s);
  cudaFreeHost(peak);
  cudaFree(dev);
  if (!v.ok()) return v.status();
  return r;
}

}  // namespace kvtier::bench
