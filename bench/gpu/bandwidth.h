#ifndef KVTIER_BENCH_GPU_BANDWIDTH_H_
#define KVTIER_BENCH_GPU_BANDWIDTH_H_

// Host <-> device copy bandwidth, measured with CUDA events: from a pinned shared-memory mapping
// (shm_open + mmap + cudaHostRegister, as a worker maps the daemon's pool) against plain
// cudaMallocHost memory, the peak a pinned copy can reach.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::bench {

struct BandwidthResult {
  std::string pool_kind;    // "shm" or "anonymous" (when /dev/shm was too small)
  double pin_seconds = 0;   // cudaHostRegister of the whole mapping, chunk by chunk
  double shm_h2d_gbps = 0;  // one large copy per pinned chunk
  double shm_d2h_gbps = 0;
  double shm_h2d_blocks_gbps = 0;  // 32 KiB blocks in one batched call (the old staging)
  // What the stager issues for one layer of pages in consecutive slots: 32 KiB rows at the 7B
  // page pitch (28 layers × 32 KiB), 64 rows per pitched copy (GroupStrided + CopyIssuer).
  double shm_h2d_pitched_gbps = 0;
  double peak_h2d_gbps = 0;  // cudaMallocHost
  double peak_d2h_gbps = 0;
};

// Copies `bytes` each way `reps` times per measure (median of the reps, after one warm-up).
absl::StatusOr<BandwidthResult> MeasureBandwidth(uint64_t bytes, int reps);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_GPU_BANDWIDTH_H_
