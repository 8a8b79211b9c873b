#ifndef KVTIER_WORKER_CUDA_CUDA_API_H_
#define KVTIER_WORKER_CUDA_CUDA_API_H_

// The one seam between kvtier's CUDA code and a CUDA runtime: the real one (cuda_runtime_api.h,
// nvcc kernels) or the simulated device of worker/cuda/sim (host threads for streams, guarded
// host allocations for device memory, CPU references for kernels). A target chooses by what it
// links: CUDA::cudart_static, or kvtier::cuda_sim, which defines KVTIER_CUDA_SIM for its users.
// CUDA sources include this header, never <cuda_runtime_api.h> itself.

#ifdef KVTIER_CUDA_SIM
#include "worker/cuda/sim/cuda_runtime_sim.h"
#else
#include <cuda_runtime_api.h>
#endif

#endif  // KVTIER_WORKER_CUDA_CUDA_API_H_
