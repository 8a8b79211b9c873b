#ifndef KVTIER_WORKER_CUDA_SIM_COUNTERS_H_
#define KVTIER_WORKER_CUDA_SIM_COUNTERS_H_

// What the simulated device counts: the host's conversation with the runtime, the figures a
// device run can check (docs/cuda.md, "Calls per decode step"). Process-wide, every thread
// together; thread-safe.

#include <cstdint>

namespace kvtier::cudasim {

struct Counters {
  // Runtime calls the host makes (launches and cuBLAS GEMMs included); the error queries
  // (cudaGetLastError, cudaPeekAtLastError, cudaGetErrorName/String) are not counted.
  uint64_t runtime_calls = 0;
  // Kernel launcher calls and cuBLAS GEMMs. A launcher may start several kernels on a device
  // (PagedDecodeAttention: chunks, merge and mass; DequantizePages/QuantizePages one each).
  uint64_t kernel_launches = 0;
  // Calls that enqueue copies (cudaMemcpy*, cudaMemcpyBatchAsync, cudaMemset*), and the copy
  // descriptors they carry: one per plain or 2D copy (a 2D copy is one pitched DMA command),
  // one per entry of a batch.
  uint64_t copy_calls = 0;
  uint64_t copy_descriptors = 0;
  uint64_t h2d_bytes = 0;  // bytes copied from host to device memory (pinned or not)
  // Calls that block the host until device work completes: stream, event and device
  // synchronization, cudaMemcpy and cudaMemset, cudaFree and cudaFreeHost (they synchronize
  // the device), and copies into pageable memory.
  uint64_t host_waits = 0;
  uint64_t event_queries = 0;  // cudaEventQuery (polls; they never block)
};

Counters ReadCounters();
void ResetCounters();

// Counting, for the simulation's entry points.
enum class Counter : uint8_t {
  kRuntimeCall,
  kKernelLaunch,
  kCopyCall,
  kCopyDescriptor,
  kH2dBytes,
  kHostWait,
  kEventQuery,
};
void Count(Counter c, uint64_t n = 1);

}  // namespace kvtier::cudasim

#endif  // KVTIER_WORKER_CUDA_SIM_COUNTERS_H_
