// kv_ops.h's launchers on the simulated device: the codec kernels run codec_reference.h (the
// algorithm the GPU kernels implement, byte for byte the CPU codecs), page copies run memcpy.

#include <cstring>
#include <vector>

#include "worker/cuda/sim/kernel.h"
#include "worker/kernels/cuda/codec_reference.h"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/kv_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

namespace ref = reference;
using cudasim::Load;
using cudasim::Touch;

cudaError_t Refused(LaunchCheck check) {
  return check == LaunchCheck::kNothing ? cudaSuccess : cudaErrorInvalidValue;
}

// Tensor t of a launch, widened to f32 (bf16 exactly).
bool Widen(const void* src, KvDtype dtype, uint64_t n, std::vector<float>* out) {
  if (!Touch(src, n * DtypeBytes(dtype), "source tensor")) return false;
  out->resize(n);
  if (dtype == KvDtype::kF32) {
    std::memcpy(out->data(), src, n * 4);
  } else {
    const uint16_t* b = static_cast<const uint16_t*>(src);
    for (uint64_t i = 0; i < n; ++i) (*out)[i] = Bf16BitsToF32(b[i]);
  }
  return true;
}

}  // namespace

cudaError_t QuantizePages(const QuantizeParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckQuantize(p);
  if (check != LaunchCheck::kLaunch) return Refused(check);
  return cudasim::Launch(stream, "QuantizePages", [p] {
    const uint64_t n = uint64_t{p.rows} * p.cols;
    const uint64_t encoded = EncodedBytes(p.codec, p.role, p.rows, p.cols);
    std::vector<float> values;
    for (uint32_t t = 0; t < p.num_tensors; ++t) {
      bool ok = true;
      const void* src = Load(p.src, t, "src pointer array", &ok);
      uint8_t* dst = Load(p.dst, t, "dst pointer array", &ok);
      if (!ok || !Widen(src, p.src_dtype, n, &values) || !Touch(dst, encoded, "encoded page")) {
        return;
      }
      ref::Encode(static_cast<ref::Codec>(p.codec), p.role == Role::kKey, values.data(), p.rows,
                  p.cols, dst);
    }
  });
}

cudaError_t DequantizePages(const DequantizeParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckDequantize(p);
  if (check != LaunchCheck::kLaunch) return Refused(check);
  return cudasim::Launch(stream, "DequantizePages", [p] {
    const uint64_t n = uint64_t{p.rows} * p.cols;
    const uint64_t encoded = EncodedBytes(p.codec, p.role, p.rows, p.cols);
    std::vector<float> values(n);
    for (uint32_t t = 0; t < p.num_tensors; ++t) {
      bool ok = true;
      const uint8_t* src = Load(p.src, t, "src pointer array", &ok);
      void* dst = Load(p.dst, t, "dst pointer array", &ok);
      if (!ok || !Touch(src, encoded, "encoded page") ||
          !Touch(dst, n * DtypeBytes(p.dst_dtype), "decoded tensor")) {
        return;
      }
      ref::Decode(static_cast<ref::Codec>(p.codec), p.role == Role::kKey, src, p.rows, p.cols,
                  values.data());
      if (p.dst_dtype == KvDtype::kF32) {
        std::memcpy(dst, values.data(), n * 4);
      } else {
        uint16_t* b = static_cast<uint16_t*>(dst);
        for (uint64_t i = 0; i < n; ++i) b[i] = F32ToBf16Bits(values[i]);
      }
    }
  });
}

cudaError_t CopyPages(const PageCopyParams& p, cudaStream_t stream) {
  const LaunchCheck check = CheckCopyPages(p);
  if (check != LaunchCheck::kLaunch) return Refused(check);
  return cudasim::Launch(stream, "CopyPages", [p] {
    for (uint32_t i = 0; i < p.num_blocks; ++i) {
      bool ok = true;
      const void* src = Load(p.src, i, "src pointer array", &ok);
      void* dst = Load(p.dst, i, "dst pointer array", &ok);
      if (!ok || !Touch(src, p.block_bytes, "source block") ||
          !Touch(dst, p.block_bytes, "destination block")) {
        return;
      }
      std::memcpy(dst, src, p.block_bytes);
    }
  });
}

}  // namespace kvtier::worker::kernels::cuda
