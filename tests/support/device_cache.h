#ifndef KVTIER_TESTS_SUPPORT_DEVICE_CACHE_H_
#define KVTIER_TESTS_SUPPORT_DEVICE_CACHE_H_

// Host tensors in, device tensors to the wrapped cache: lets a host-side test engine (the
// synthetic engine) drive a sequence on the CUDA backend, real or simulated, as an engine with
// device tensors would. Every call synchronizes the device before it returns. Not thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/attention_cache.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_status.h"

namespace kvtier::testing {

class DeviceCache final : public worker::AttentionCache {
 public:
  DeviceCache(worker::AttentionCache& inner, const worker::AttentionShape& shape)
      : inner_(inner), shape_(shape) {}

  uint32_t Length(uint32_t layer) const override { return inner_.Length(layer); }

  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override {
    const uint64_t bytes = uint64_t{n} * shape_.num_kv_heads * shape_.head_dim * sizeof(float);
    Buffer dk(bytes), dv(bytes);
    KVTIER_CUDA_RETURN_IF_ERROR(dk.Upload(k));
    KVTIER_CUDA_RETURN_IF_ERROR(dv.Upload(v));
    absl::Status s = inner_.Append(layer, dk.get(), dv.get(), n);
    KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the buffers die here
    return s;
  }

  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override {
    const uint64_t bytes = uint64_t{n} * shape_.num_q_heads * shape_.head_dim * sizeof(float);
    Buffer dq(bytes), dout(bytes);
    KVTIER_CUDA_RETURN_IF_ERROR(dq.Upload(q));
    absl::Status s = inner_.Attend(layer, dq.get(), n, dout.get(), position_mass);
    KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    if (s.ok()) KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(out, dout.get(), bytes, cudaMemcpyDefault));
    return s;
  }

 private:
  // Device memory for one call's tensor.
  class Buffer {
   public:
    explicit Buffer(uint64_t bytes) : bytes_(bytes) {
      if (cudaMalloc(&p_, bytes) != cudaSuccess) p_ = nullptr;
    }
    ~Buffer() { cudaFree(p_); }
    float* get() const { return static_cast<float*>(p_); }
    cudaError_t Upload(const float* host) {
      if (p_ == nullptr) return cudaErrorMemoryAllocation;
      return cudaMemcpy(p_, host, bytes_, cudaMemcpyHostToDevice);
    }

   private:
    void* p_ = nullptr;
    uint64_t bytes_;
  };

  worker::AttentionCache& inner_;
  const worker::AttentionShape shape_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_DEVICE_CACHE_H_
