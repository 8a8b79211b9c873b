#ifndef KVTIER_WORKER_KERNELS_CUDA_DEVICE_UTILS_CUH_
#define KVTIER_WORKER_KERNELS_CUDA_DEVICE_UTILS_CUH_

// Device helpers shared by the .cu files: fixed-order warp reductions, element conversions and
// vector row loads. Included only by .cu files.

#include <cuda_bf16.h>

#include <cstdint>

namespace kvtier::worker::kernels::cuda {

// Sum over the warp by a fixed xor-shuffle tree: the same inputs give the same bits.
__device__ inline float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
  return x;
}

__device__ inline float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  return x;
}

__device__ inline float WarpMin(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fminf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  return x;
}

__device__ inline float ToFloat(float x) { return x; }
__device__ inline float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ inline T FromFloat(float x);
template <>
__device__ inline float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Loads n consecutive elements (n in {2, 4}) as one vector access and widens them to f32.
// REQUIRES: src aligned to n * sizeof(T).
template <int kN>
__device__ inline void LoadRow(const float* src, float* dst) {
  static_assert(kN == 2 || kN == 4);
  if constexpr (kN == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x, dst[1] = v.y;
  }
}

template <int kN>
__device__ inline void LoadRow(const __nv_bfloat16* src, float* dst) {
  static_assert(kN == 2 || kN == 4);
  if constexpr (kN == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v.x);
    const __nv_bfloat162 c = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
    dst[0] = __low2float(a), dst[1] = __high2float(a);
    dst[2] = __low2float(c), dst[3] = __high2float(c);
  } else {
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(src);
    dst[0] = __low2float(a), dst[1] = __high2float(a);
  }
}

}  // namespace kvtier::worker::kernels::cuda

#endif  // KVTIER_WORKER_KERNELS_CUDA_DEVICE_UTILS_CUH_
