#ifndef KVTIER_ENGINE_QUANT_H_
#define KVTIER_ENGINE_QUANT_H_

// ggml block formats (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q6_K): fp16 conversion, row
// dequantization, reference quantizers (for tests and an 8-bit KV tier), and fused
// quantized-row · f32-vector dot products. Dot products have an AVX2/FMA/F16C version chosen at
// run time and a portable scalar version; both accumulate in f32. Block layouts follow
// ggml-common.h (see shared/REFERENCE.md); Q4 nibbles are NOT interleaved (low nibbles are
// elements 0..15 of a block, high nibbles 16..31).
//
// All functions are pure and thread-safe.

#include <cstddef>
#include <cstdint>

#include "engine/gguf.h"

namespace kvtier::engine {

float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);  // round to nearest even

// Element count `n` must be a multiple of the type's block size.
void DequantizeRow(GgmlType type, const void* src, float* dst, size_t n);

// Reference quantizers, as ggml's quantize_row_*_ref. `n` a multiple of 32.
void QuantizeRowQ4_0(const float* x, void* dst, size_t n);
void QuantizeRowQ4_1(const float* x, void* dst, size_t n);
void QuantizeRowQ8_0(const float* x, void* dst, size_t n);

// Which implementation the dot products use.
enum class KernelIsa { kScalar, kAvx2 };
// The best the CPU supports (AVX2+FMA+F16C, else scalar), unless KVTIER_KERNELS=scalar is set.
KernelIsa DetectKernelIsa();
const char* KernelIsaName(KernelIsa isa);

// Σ dequant(row)[i] · x[i] over `n` elements of one row of `type`.
using VecDotFn = float (*)(const void* row, const float* x, size_t n);
// The dot product for `type` and `isa` (scalar when `isa` has no special version of it).
VecDotFn GetVecDot(GgmlType type, KernelIsa isa);

// Variants taking the activation's per-32-element block sums (BlockSums, computed once per
// token by the caller): for Q4_1 the m·Σx term is the same for every row, so this saves ~15% of
// the kernel. The 4-row variant reads sums[t·(n/32) + block] and is bit-identical per row to the
// single-row one. Null where no such kernel exists (then use GetVecDot / GetVecDot4).
void BlockSums(const float* x, size_t n, float* sums);
using VecDotSumsFn = float (*)(const void* row, const float* x, const float* sums, size_t n);
using VecDot4SumsFn = void (*)(const void* row, const float* x, const float* sums, size_t stride,
                               size_t n, float* out);
VecDotSumsFn GetVecDotSums(GgmlType type, KernelIsa isa);
VecDot4SumsFn GetVecDot4Sums(GgmlType type, KernelIsa isa);

// y[i] += a · x[i] for i < n (f32; vectorized for kAvx2).
using AxpyFn = void (*)(float a, const float* x, float* y, size_t n);
AxpyFn GetAxpy(KernelIsa isa);

// out[t] = Σ dequant(row)[i] · x[t·stride + i] for t < 4, bit-identical to four GetVecDot
// calls; null when `type`/`isa` has no such kernel (callers then use GetVecDot).
using VecDot4Fn = void (*)(const void* row, const float* x, size_t stride, size_t n, float* out);
VecDot4Fn GetVecDot4(GgmlType type, KernelIsa isa);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_QUANT_H_
