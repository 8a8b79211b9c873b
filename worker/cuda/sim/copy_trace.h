#ifndef KVTIER_WORKER_CUDA_SIM_COPY_TRACE_H_
#define KVTIER_WORKER_CUDA_SIM_COPY_TRACE_H_

// What a test can ask the simulated device and not a real one: every copy issued (memcpy,
// batched or not), in issue order, while a trace is on. Lets tests check which host bytes were
// copied, in what order and how often (a device run counts bytes instead). Thread-safe.

#include <cstddef>
#include <vector>

namespace kvtier::cudasim {

struct TracedCopy {
  const void* src = nullptr;  // as the caller passed it
  void* dst = nullptr;
  size_t bytes = 0;
};

// Starts (or restarts, empty) the trace.
void StartCopyTrace();
// The copies issued since the start or the last take, and restarts it empty; the trace stays on.
std::vector<TracedCopy> TakeCopyTrace();
void StopCopyTrace();

// The runtime's side: records copies issued while a trace is on.
void TraceCopy(const void* src, void* dst, size_t bytes);

}  // namespace kvtier::cudasim

#endif  // KVTIER_WORKER_CUDA_SIM_COPY_TRACE_H_
