#ifndef KVTIER_WORKER_CUDA_SIM_KERNEL_H_
#define KVTIER_WORKER_CUDA_SIM_KERNEL_H_

// Kernel launches on the simulated device: what the CPU references of worker/kernels/cuda/sim and
// engine/cuda/sim use in place of <<<grid, block, 0, stream>>>.

#include <cstdint>
#include <functional>

#include "worker/cuda/sim/cuda_runtime_sim.h"

namespace kvtier::cudasim {

// Enqueues `body` on `stream` (null: the legacy default stream) as kernel `name`: it runs on the
// stream's thread after the stream's earlier work, and is skipped once the device has faulted.
// Returns the thread's last error, as a launcher's cudaGetLastError() does.
cudaError_t Launch(cudaStream_t stream, const char* name, std::function<void()> body);

// As Launch, for a library call (cuBLAS) that leaves the thread's last error alone: false when
// `stream` is not a live stream (nothing enqueued).
bool EnqueueKernel(cudaStream_t stream, const char* name, std::function<void()> body);

// Inside a kernel body: whether [p, p + bytes) is memory the device can reach (one device
// allocation, pinned or registered host range). When it is not, the device faults: a sticky
// cudaErrorIllegalAddress that every later synchronizing call returns, reported on stderr with
// the kernel's name and `what`; the body should then return.
bool Touch(const void* p, uint64_t bytes, const char* what);

// Reads element i of a device array of T, after Touch-ing it (a fault returns T{} and sets *ok).
template <typename T>
T Load(const T* array, uint64_t i, const char* what, bool* ok) {
  if (!Touch(array + i, sizeof(T), what)) {
    *ok = false;
    return T{};
  }
  return array[i];
}

}  // namespace kvtier::cudasim

#endif  // KVTIER_WORKER_CUDA_SIM_KERNEL_H_
