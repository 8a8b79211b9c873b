// T2 quantize / dequantize kernels against the CPU codecs (worker/codecs): the same bytes for the
// same values (exact; on a CPU without FMA the CPU codec may differ by one code on exact ties, see
// codec_math.h), and page gather/scatter, including zero-copy reads of pinned host memory.

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/codecs/codec.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/kv_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

using ::kvtier::testing::DeviceBuffer;

const codecs::Codec& CpuCodec(CodecKind k) {
  switch (k) {
    case CodecKind::kFp8E4m3:
      return codecs::Fp8E4m3Codec();
    case CodecKind::kMinMax:
      return codecs::MinMaxCodec();
    default:
      return codecs::Int8KiviCodec();
  }
}

bool CpuFusesQuantize() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// `count` tensors of [rows][cols] as f32 values (bf16-representable when bf16), and their device
// bytes in `dtype`.
struct Tensors {
  std::vector<std::vector<float>> values;
  std::vector<uint8_t> bytes;
};

Tensors MakeTensors(uint32_t count, uint32_t rows, uint32_t cols, KvDtype dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 2.f);
  Tensors t;
  const uint64_t elems = uint64_t{rows} * cols, eb = DtypeBytes(dtype);
  t.bytes.resize(count * elems * eb);
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<float> v(elems);
    for (uint64_t j = 0; j < elems; ++j) {
      float x = n(rng) + (i % 2 ? 5.f : 0.f);
      if (i == 2) x = 1.5f;  // a constant tensor: zero scales
      if (dtype == KvDtype::kBf16) {
        const uint16_t h = F32ToBf16Bits(x);
        x = Bf16BitsToF32(h);
        std::memcpy(&t.bytes[(i * elems + j) * 2], &h, 2);
      } else {
        std::memcpy(&t.bytes[(i * elems + j) * 4], &x, 4);
      }
      v[j] = x;
    }
    t.values.push_back(std::move(v));
  }
  return t;
}

TEST(KvOpsGpuTest, QuantizeWritesTheCpuCodecsBytesAndDequantizeReadsThem) {
  KVTIER_SKIP_WITHOUT_GPU();
  const bool exact = CpuFusesQuantize();
  const uint32_t count = 5;
  for (CodecKind codec : {CodecKind::kInt8Kivi, CodecKind::kFp8E4m3, CodecKind::kMinMax}) {
    for (Role role : {Role::kKey, Role::kValue}) {
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16}) {
        for (auto [rows, cols] : {std::pair{1u, 64u}, {16u, 512u}, {32u, 256u}, {7u, 1000u}}) {
          SCOPED_TRACE(::testing::Message()
                       << "codec " << int(codec) << " role " << int(role) << " dtype " << int(dtype)
                       << " " << rows << "x" << cols);
          const codecs::Codec& cpu = CpuCodec(codec);
          const codecs::TensorRole cpu_role =
              role == Role::kKey ? codecs::TensorRole::kKey : codecs::TensorRole::kValue;
          const uint64_t enc = EncodedBytes(codec, role, rows, cols);
          ASSERT_EQ(enc, cpu.encoded_bytes(cpu_role, rows, cols));
          const uint64_t elems = uint64_t{rows} * cols, eb = DtypeBytes(dtype);
          const Tensors t = MakeTensors(count, rows, cols, dtype, rows * cols + int(codec));
          DeviceBuffer<uint8_t> src(t.bytes), codes(count * enc + 16), back(count * elems * 4);
          std::vector<const void*> sp;
          std::vector<uint8_t*> dp;
          std::vector<void*> bp;
          for (uint32_t i = 0; i < count; ++i) {
            sp.push_back(src.get() + i * elems * eb);
            dp.push_back(codes.get() + i * enc);
            bp.push_back(back.get() + i * elems * 4);
          }
          DeviceBuffer<const void*> sp_dev(sp);
          DeviceBuffer<uint8_t*> dp_dev(dp);
          DeviceBuffer<void*> bp_dev(bp);
          QuantizeParams q;
          q.src = sp_dev.get();
          q.dst = dp_dev.get();
          q.num_tensors = count;
          q.rows = rows;
          q.cols = cols;
          q.codec = codec;
          q.role = role;
          q.src_dtype = dtype;
          ASSERT_CUDA_OK(QuantizePages(q, nullptr));
          const std::vector<uint8_t> got = codes.Download();
          for (uint32_t i = 0; i < count; ++i) {
            std::vector<uint8_t> want(enc);
            cpu.encode(cpu_role, t.values[i].data(), rows, cols, want.data());
            const uint64_t header = enc - elems;
            ASSERT_EQ(0, std::memcmp(got.data() + i * enc, want.data(), header)) << "tensor " << i;
            for (uint64_t j = header; j < enc; ++j) {
              const int d = int{got[i * enc + j]} - int{want[j]};
              if (exact) {
                ASSERT_EQ(d, 0) << "tensor " << i << " code " << j - header;
              } else {
                ASSERT_LE(std::abs(d), 1);
              }
            }
          }
          // Dequantize the CPU codec's bytes: f32 output equals the CPU decode exactly.
          std::vector<uint8_t> cpu_codes(count * enc);
          for (uint32_t i = 0; i < count; ++i) {
            cpu.encode(cpu_role, t.values[i].data(), rows, cols, cpu_codes.data() + i * enc);
          }
          ASSERT_CUDA_OK(codes.Upload(std::vector<uint8_t>(cpu_codes.begin(), cpu_codes.end())));
          DequantizeParams dq;
          dq.src = reinterpret_cast<const uint8_t* const*>(dp_dev.get());
          dq.dst = bp_dev.get();
          dq.num_tensors = count;
          dq.rows = rows;
          dq.cols = cols;
          dq.codec = codec;
          dq.role = role;
          dq.dst_dtype = KvDtype::kF32;
          ASSERT_CUDA_OK(DequantizePages(dq, nullptr));
          const std::vector<uint8_t> out = back.Download();
          for (uint32_t i = 0; i < count; ++i) {
            std::vector<float> want(elems);
            cpu.decode(cpu_role, cpu_codes.data() + i * enc, rows, cols, want.data());
            ASSERT_EQ(0, std::memcmp(out.data() + i * elems * 4, want.data(), elems * 4));
          }
          // bf16 output: the same values rounded to nearest even.
          dq.dst_dtype = KvDtype::kBf16;
          ASSERT_CUDA_OK(DequantizePages(dq, nullptr));
          const std::vector<uint8_t> out16 = back.Download();
          std::vector<float> want(elems);
          cpu.decode(cpu_role, cpu_codes.data(), rows, cols, want.data());
          for (uint64_t j = 0; j < elems; ++j) {
            uint16_t h;
            std::memcpy(&h, out16.data() + 2 * j, 2);
            ASSERT_EQ(h, F32ToBf16Bits(want[j])) << j;
          }
        }
      }
    }
  }
}

TEST(KvOpsGpuTest, RejectsBadParams) {
  KVTIER_SKIP_WITHOUT_GPU();
  EXPECT_EQ(QuantizePages(QuantizeParams{}, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(DequantizePages(DequantizeParams{}, nullptr), cudaErrorInvalidValue);
  PageCopyParams p;
  DeviceBuffer<const void*> a(1);
  DeviceBuffer<void*> b(1);
  p.src = a.get();
  p.dst = b.get();
  p.num_blocks = 1;
  p.block_bytes = 24;  // not a multiple of 16
  EXPECT_EQ(CopyPages(p, nullptr), cudaErrorInvalidValue);
}

TEST(KvOpsGpuTest, CopyPagesGathersDeviceAndMappedHostBlocks) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t n = 37;
  const uint64_t block = 32 * 1024 + 48;  // not a multiple of the unrolled stride
  std::vector<uint8_t> host(n * block);
  std::mt19937 rng(1);
  for (uint8_t& b : host) b = static_cast<uint8_t>(rng());
  uint8_t* pinned = nullptr;
  ASSERT_CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * block, cudaHostAllocMapped));
  std::memcpy(pinned, host.data(), host.size());
  DeviceBuffer<uint8_t> scattered(host), gathered(n * block), from_host(n * block);
  std::vector<uint32_t> perm(n);
  for (uint32_t i = 0; i < n; ++i) perm[i] = (i * 11) % n;
  std::vector<const void*> src, hsrc;
  std::vector<void*> dst, hdst;
  for (uint32_t i = 0; i < n; ++i) {
    src.push_back(scattered.get() + perm[i] * block);
    dst.push_back(gathered.get() + i * block);
    hsrc.push_back(pinned + perm[i] * block);  // UVA: the host pointer is the device pointer
    hdst.push_back(from_host.get() + i * block);
  }
  DeviceBuffer<const void*> src_d(src), hsrc_d(hsrc);
  DeviceBuffer<void*> dst_d(dst), hdst_d(hdst);
  ASSERT_CUDA_OK(CopyPages({src_d.get(), dst_d.get(), n, block}, nullptr));
  ASSERT_CUDA_OK(CopyPages({hsrc_d.get(), hdst_d.get(), n, block}, nullptr));
  const std::vector<uint8_t> g = gathered.Download(), h = from_host.Download();
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(0, std::memcmp(g.data() + i * block, host.data() + perm[i] * block, block)) << i;
    ASSERT_EQ(0, std::memcmp(h.data() + i * block, host.data() + perm[i] * block, block)) << i;
  }
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace kvtier::worker::kernels::cuda
