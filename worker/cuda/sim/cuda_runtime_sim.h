#ifndef KVTIER_WORKER_CUDA_SIM_CUDA_RUNTIME_SIM_H_
#define KVTIER_WORKER_CUDA_SIM_CUDA_RUNTIME_SIM_H_

// The simulated CUDA device: the subset of the CUDA runtime API that kvtier's CUDA code calls,
// with the real API's names, values and contracts, implemented on the host (see docs/cuda.md,
// "The simulated device"). Reached only through worker/cuda/cuda_api.h.
//
//  - Device memory (cudaMalloc) and pinned host memory (cudaMallocHost) are guarded host
//    mappings: PROT_NONE guard pages on both sides, poisoned (0xFF: NaN as f32 and bf16) when
//    allocated, red zones checked on free, and PROT_NONE for a while after free, so overruns,
//    reads of what was never written and use after free show.
//  - Streams are ordered queues each run by its own thread, with random small delays, so work
//    on two streams overlaps in any order unless an event orders it. Events record, wait, query
//    and synchronize as CUDA's do. The legacy default stream (null) orders against blocking
//    streams; cudaStreamNonBlocking streams do not.
//  - Copies check their pointers as the runtime does (a device side must lie within one
//    allocation); copies from pinned or registered memory are asynchronous, from pageable memory
//    staged at the call (host to device) or completed before the call returns (device to host).
//  - cudaHostRegister refuses ranges that are not fully mapped readable and writable (as the
//    driver, which must pin every page), and ranges overlapping a registered one.
//  - Kernels (the launchers of worker/kernels/cuda and engine/cuda) run CPU references on the
//    stream's thread; each checks that every range it touches is device-accessible memory, and
//    an access outside it is a sticky cudaErrorIllegalAddress, as on a device.
//  - Errors: the last error is per thread and cleared by cudaGetLastError, as the runtime's.
//
// Thread-safe, as the runtime is.

#include <cstddef>
#include <cstdint>

#define CUDART_VERSION 13000

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorHostMemoryAlreadyRegistered = 712,
  cudaErrorHostMemoryNotRegistered = 713,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemcpySrcAccessOrder {
  cudaMemcpySrcAccessOrderInvalid = 0,
  cudaMemcpySrcAccessOrderStream = 1,
  cudaMemcpySrcAccessOrderDuringApiCall = 2,
  cudaMemcpySrcAccessOrderAny = 3,
};
enum cudaMemcpyFlags { cudaMemcpyFlagDefault = 0, cudaMemcpyFlagPreferOverlapWithCompute = 1 };
struct cudaMemcpyAttributes {
  enum cudaMemcpySrcAccessOrder srcAccessOrder;
  unsigned int flags;
};

inline constexpr unsigned int cudaStreamDefault = 0;
inline constexpr unsigned int cudaStreamNonBlocking = 1;
inline constexpr unsigned int cudaEventDefault = 0;
inline constexpr unsigned int cudaEventDisableTiming = 2;
inline constexpr unsigned int cudaHostRegisterDefault = 0;
inline constexpr unsigned int cudaHostRegisterPortable = 1;
inline constexpr unsigned int cudaHostRegisterMapped = 2;
inline constexpr unsigned int cudaHostAllocDefault = 0;
inline constexpr unsigned int cudaHostAllocPortable = 1;
inline constexpr unsigned int cudaHostAllocMapped = 2;

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void* ptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);
// CUDA 13's signature (no failure index).
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                 size_t num_attrs, cudaStream_t stream);

#endif  // KVTIER_WORKER_CUDA_SIM_CUDA_RUNTIME_SIM_H_
