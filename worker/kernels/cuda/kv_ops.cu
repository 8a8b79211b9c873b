// T2 quantize / dequantize and page copy kernels. Formats: kv_ops.h.

#include <cuda_bf16.h>

#include "worker/kernels/cuda/codec_math.h"
#include "worker/kernels/cuda/device_utils.cuh"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/kv_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

namespace cm = codec_math;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T>
__device__ inline float At(const T* src, uint64_t i) {
  return ToFloat(src[i]);
}

// Keys, KIVI: one thread per channel walks the page's tokens.
template <typename T>
__device__ void EncodeKiviKeys(const T* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  float* scale = reinterpret_cast<float*>(dst);
  float* lo_out = scale + cols;
  uint8_t* codes = dst + uint64_t{cols} * 8;
  for (uint32_t c = threadIdx.x; c < cols; c += kThreads) {
    float lo = rows > 0 ? At(src, c) : 0.f, hi = lo;
    for (uint32_t r = 1; r < rows; ++r) {
      const float x = At(src, uint64_t{r} * cols + c);
      lo = cm::Min(lo, x);
      hi = cm::Max(hi, x);
    }
    const cm::Affine a = cm::MakeAffine(lo, hi);
    scale[c] = a.scale;
    lo_out[c] = lo;
    const float bias = cm::Bias(lo, a.inv);
    for (uint32_t r = 0; r < rows; ++r) {
      codes[uint64_t{r} * cols + c] = cm::QuantizeU8(At(src, uint64_t{r} * cols + c), a.inv, bias);
    }
  }
}

// Per-row groups (KIVI values, fp8): one warp per token; min/max/absmax are exact in any order.
template <typename T>
__device__ void EncodeRows(CodecKind codec, const T* src, uint32_t rows, uint32_t cols,
                           uint8_t* dst) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scale = reinterpret_cast<float*>(dst);
  const bool fp8 = codec == CodecKind::kFp8E4m3;
  uint8_t* codes = dst + uint64_t{rows} * (fp8 ? 4 : 8);
  for (uint32_t r = warp; r < rows; r += kWarps) {
    const T* row = src + uint64_t{r} * cols;
    float lo = INFINITY, hi = -INFINITY, amax = 0.f;
    for (uint32_t c = lane; c < cols; c += 32) {
      const float x = At(row, c);
      lo = cm::Min(lo, x);
      hi = cm::Max(hi, x);
      amax = cm::Max(amax, fabsf(x));
    }
    lo = WarpMin(lo), hi = WarpMax(hi), amax = WarpMax(amax);
    if (cols == 0) lo = hi = 0.f;
    const cm::Affine a = fp8 ? cm::MakeFp8(amax) : cm::MakeAffine(lo, hi);
    if (lane == 0) {
      scale[r] = a.scale;
      if (!fp8) scale[rows + r] = lo;
    }
    uint8_t* out = codes + uint64_t{r} * cols;
    const float bias = cm::Bias(lo, a.inv);
    for (uint32_t c = lane; c < cols; c += 32) {
      const float x = At(row, c);
      out[c] = fp8 ? cm::EncodeE4m3(cm::Mul(x, a.inv)) : cm::QuantizeU8(x, a.inv, bias);
    }
  }
}

// One group for the whole tensor (minmax).
template <typename T>
__device__ void EncodeTensor(const T* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  __shared__ float lo_sh[kWarps], hi_sh[kWarps];
  const uint64_t n = uint64_t{rows} * cols;
  float lo = INFINITY, hi = -INFINITY;
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
    const float x = At(src, i);
    lo = cm::Min(lo, x);
    hi = cm::Max(hi, x);
  }
  lo = WarpMin(lo), hi = WarpMax(hi);
  if (threadIdx.x % 32 == 0) lo_sh[threadIdx.x / 32] = lo, hi_sh[threadIdx.x / 32] = hi;
  __syncthreads();
  lo = lo_sh[0], hi = hi_sh[0];
  for (int w = 1; w < kWarps; ++w) lo = cm::Min(lo, lo_sh[w]), hi = cm::Max(hi, hi_sh[w]);
  if (n == 0) lo = hi = 0.f;
  const cm::Affine a = cm::MakeAffine(lo, hi);
  float* header = reinterpret_cast<float*>(dst);
  if (threadIdx.x == 0) header[0] = a.scale, header[1] = lo;
  const float bias = cm::Bias(lo, a.inv);
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
    dst[8 + i] = cm::QuantizeU8(At(src, i), a.inv, bias);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) QuantizeKernel(QuantizeParams p) {
  const T* src = static_cast<const T*>(p.src[blockIdx.x]);
  uint8_t* dst = p.dst[blockIdx.x];
  if (p.codec == CodecKind::kMinMax) {
    EncodeTensor(src, p.rows, p.cols, dst);
  } else if (p.codec == CodecKind::kInt8Kivi && p.role == Role::kKey) {
    EncodeKiviKeys(src, p.rows, p.cols, dst);
  } else {
    EncodeRows(p.codec, src, p.rows, p.cols, dst);
  }
}

__device__ inline float DecodeAt(const DequantizeParams& p, const uint8_t* src, uint32_t r,
                                 uint32_t c) {
  const float* f = reinterpret_cast<const float*>(src);
  const uint64_t i = uint64_t{r} * p.cols + c;
  switch (p.codec) {
    case CodecKind::kMinMax:
      return cm::DequantizeU8(src[8 + i], f[1], f[0]);
    case CodecKind::kFp8E4m3:
      return cm::Mul(cm::DecodeE4m3(src[uint64_t{p.rows} * 4 + i]), f[r]);
    case CodecKind::kInt8Kivi:
    default:
      if (p.role == Role::kKey) {
        return cm::DequantizeU8(src[uint64_t{p.cols} * 8 + i], f[p.cols + c], f[c]);
      }
      return cm::DequantizeU8(src[uint64_t{p.rows} * 8 + i], f[p.rows + r], f[r]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) DequantizeKernel(DequantizeParams p) {
  const uint8_t* src = p.src[blockIdx.x];
  T* dst = static_cast<T*>(p.dst[blockIdx.x]);
  const uint64_t n = uint64_t{p.rows} * p.cols;
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) {
    dst[i] = FromFloat<T>(
        DecodeAt(p, src, static_cast<uint32_t>(i / p.cols), static_cast<uint32_t>(i % p.cols)));
  }
}

__global__ void __launch_bounds__(kThreads) CopyPagesKernel(PageCopyParams p) {
  const int4* src = static_cast<const int4*>(p.src[blockIdx.x]);
  int4* dst = static_cast<int4*>(p.dst[blockIdx.x]);
  const uint64_t n = p.block_bytes / sizeof(int4);
  // Four independent 16-byte loads in flight per thread before the stores.
  uint64_t i = threadIdx.x;
  for (; i + 3 * kThreads < n; i += 4 * kThreads) {
    const int4 a = src[i], b = src[i + kThreads], c = src[i + 2 * kThreads],
               d = src[i + 3 * kThreads];
    dst[i] = a, dst[i + kThreads] = b, dst[i + 2 * kThreads] = c, dst[i + 3 * kThreads] = d;
  }
  for (; i < n; i += kThreads) dst[i] = src[i];
}

}  // namespace

cudaError_t QuantizePages(const QuantizeParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckQuantize(p);
  if (check != LaunchCheck::kLaunch) {
    return check == LaunchCheck::kNothing ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (p.src_dtype == KvDtype::kBf16) {
    QuantizeKernel<__nv_bfloat16><<<p.num_tensors, kThreads, 0, stream>>>(p);
  } else {
    QuantizeKernel<float><<<p.num_tensors, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t DequantizePages(const DequantizeParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckDequantize(p);
  if (check != LaunchCheck::kLaunch) {
    return check == LaunchCheck::kNothing ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (p.dst_dtype == KvDtype::kBf16) {
    DequantizeKernel<__nv_bfloat16><<<p.num_tensors, kThreads, 0, stream>>>(p);
  } else {
    DequantizeKernel<float><<<p.num_tensors, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t CopyPages(const PageCopyParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckCopyPages(p);
  if (check != LaunchCheck::kLaunch) {
    return check == LaunchCheck::kNothing ? cudaSuccess : cudaErrorInvalidValue;
  }
  CopyPagesKernel<<<p.num_blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::worker::kernels::cuda
