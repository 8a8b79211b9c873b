#ifndef KVTIER_TESTS_GPU_CUDA_GPU_TEST_UTIL_H_
#define KVTIER_TESTS_GPU_CUDA_GPU_TEST_UTIL_H_

// Helpers of the GPU tests: skipping without a device, and a typed device buffer.

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_api.h"

namespace kvtier::testing {

// Empty when a CUDA device is usable; otherwise why not.
inline std::string NoGpuReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e);
  }
  if (n == 0) return "cudaGetDeviceCount returned 0 devices";
  return "";
}

#define KVTIER_SKIP_WITHOUT_GPU()                                                \
  do {                                                                           \
    const std::string kvtier_why_ = ::kvtier::testing::NoGpuReason();            \
    if (!kvtier_why_.empty()) GTEST_SKIP() << "no CUDA device: " << kvtier_why_; \
  } while (0)

#define ASSERT_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device memory for n values of T; freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<uint64_t>(n, 1) * sizeof(T)) !=
        cudaSuccess) {
      p_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  uint64_t size() const { return n_; }
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* p_ = nullptr;
  uint64_t n_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_GPU_CUDA_GPU_TEST_UTIL_H_
