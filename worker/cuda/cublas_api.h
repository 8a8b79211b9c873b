#ifndef KVTIER_WORKER_CUDA_CUBLAS_API_H_
#define KVTIER_WORKER_CUDA_CUBLAS_API_H_

// cuBLAS through the same seam as the runtime (cuda_api.h): the real library, or the simulated
// device's CPU GEMM (worker/cuda/sim/cublas_sim.h).

#ifdef KVTIER_CUDA_SIM
#include "worker/cuda/sim/cublas_sim.h"
#else
#include <cublas_v2.h>
#endif

#endif  // KVTIER_WORKER_CUDA_CUBLAS_API_H_
