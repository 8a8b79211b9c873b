// The simulated device's cuBLAS (cublas_sim.h).

#include "worker/cuda/sim/cublas_sim.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/cuda/sim/kernel.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400u) == 0) mant <<= 1, --exp;
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

int ElementBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Every f16 value widened once: GEMM operands are converted element by element.
const float* HalfTable() {
  static const float* table = [] {
    float* t = new float[65536];
    for (uint32_t h = 0; h < 65536; ++h) t[h] = HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

float Element(const void* p, cudaDataType_t t, uint64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  if (t == CUDA_R_16F) return HalfTable()[bits];
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool Supported(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

// C[m][n] (column-major, ldc) = alpha * op(A) op(B) + beta * C, f32 accumulation in k order.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType_t a_type, int lda, const void* b,
                            cudaDataType_t b_type, int ldb, const void* beta, void* c,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!Supported(a_type) || !Supported(b_type) || c_type != CUDA_R_32F ||
      compute_type != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const bool queued = kvtier::cudasim::EnqueueKernel(handle->stream, "cublasGemmEx", [=] {
    using kvtier::cudasim::Touch;
    const uint64_t a_cols = transa == CUBLAS_OP_N ? k : m, b_cols = transb == CUBLAS_OP_N ? n : k;
    const auto span = [](uint64_t cols, int ld, int rows) {
      return cols == 0 ? 0 : (cols - 1) * ld + rows;
    };
    if (!Touch(a, span(a_cols, lda, a_rows) * ElementBytes(a_type), "A") ||
        !Touch(b, span(b_cols, ldb, b_rows) * ElementBytes(b_type), "B") ||
        !Touch(c, span(n, ldc, m) * 4, "C")) {
      return;
    }
    // op(B) as f32 columns, then each row of op(A) converted once and dotted with every column.
    std::vector<float> bt(uint64_t(n) * k), row(k);
    for (int j = 0; j < n; ++j) {
      for (int p = 0; p < k; ++p) {
        bt[uint64_t(j) * k + p] = Element(
            b, b_type, transb == CUBLAS_OP_N ? uint64_t(j) * ldb + p : uint64_t(p) * ldb + j);
      }
    }
    float* out = static_cast<float*>(c);
    for (int i = 0; i < m; ++i) {
      for (int p = 0; p < k; ++p) {
        row[p] = Element(a, a_type,
                         transa == CUBLAS_OP_N ? uint64_t(p) * lda + i : uint64_t(i) * lda + p);
      }
      for (int j = 0; j < n; ++j) {
        const float* col = bt.data() + uint64_t(j) * k;
        float sum = 0.f;
        for (int p = 0; p < k; ++p) sum += row[p] * col[p];
        float& dst = out[uint64_t(j) * ldc + i];
        dst = be == 0.f ? al * sum : al * sum + be * dst;
      }
    }
  });
  return queued ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
