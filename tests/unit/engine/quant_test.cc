#include "engine/quant.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/matmul.h"
#include "engine/thread_pool.h"
#include "gtest/gtest.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::engine {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

size_t RowBytes(GgmlType t, size_t n) {
  auto tr = GetGgmlTypeTraits(static_cast<uint32_t>(t));
  return n / tr->block_size * tr->type_size;
}

TEST(Fp16Test, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), h) << std::hex << h;
  }
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.f, -24));
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HardwareFp16(float f) { return _cvtss_sh(f, 0); }

TEST(Fp16Test, RoundsLikeTheHardwareConverter) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C";
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), HardwareFp16(f)) << f;
  }
}
#endif

// Quantize → dequantize error stays within half a quantization step, plus fp16 rounding of
// the block scale (relative 2^-11) times the largest code, plus that of the Q4_1 minimum.
TEST(QuantTest, ReferenceQuantizersRoundTripWithinHalfAStep) {
  std::mt19937 rng(2);
  const size_t n = 32 * 64;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> x = RandomVector(n, rng, 0.1f + trial);
    std::vector<uint8_t> q(RowBytes(GgmlType::kQ8_0, n));
    std::vector<float> y(n);
    struct Case {
      GgmlType type;
      void (*quantize)(const float*, void*, size_t);
    } cases[] = {{GgmlType::kQ4_0, QuantizeRowQ4_0},
                 {GgmlType::kQ4_1, QuantizeRowQ4_1},
                 {GgmlType::kQ8_0, QuantizeRowQ8_0}};
    for (const Case& c : cases) {
      c.quantize(x.data(), q.data(), n);
      DequantizeRow(c.type, q.data(), y.data(), n);
      for (size_t b = 0; b < n / 32; ++b) {
        float mn = x[b * 32], mx = x[b * 32], amax = 0;
        for (int j = 0; j < 32; ++j) {
          mn = std::min(mn, x[b * 32 + j]);
          mx = std::max(mx, x[b * 32 + j]);
          amax = std::max(amax, std::fabs(x[b * 32 + j]));
        }
        float step = 0, bound = 0;
        if (c.type == GgmlType::kQ4_0) {
          step = amax / 8;
          bound = step * (0.5f + 8.f / 2048) + 1e-6f;
          // Q4_0 clamps the code +8 (value -8·d = +amax side has code 0, the other side 15).
          bound = std::max(bound, step * 1.0f + 1e-6f);
        } else if (c.type == GgmlType::kQ4_1) {
          step = (mx - mn) / 15;
          bound = step * (0.5f + 15.f / 2048) + std::fabs(mn) / 2048 + 1e-6f;
        } else {
          step = amax / 127;
          bound = step * (0.5f + 127.f / 2048) + 1e-6f;
        }
        for (int j = 0; j < 32; ++j) {
          ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), bound)
              << "type " << static_cast<int>(c.type) << " block " << b << " j " << j;
        }
      }
    }
  }
}

TEST(QuantTest, Q4NibblesAreNotInterleaved) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = j < 16 ? 0.f : 15.f;  // first half low, second half high
  std::vector<uint8_t> q(20);
  QuantizeRowQ4_1(x.data(), q.data(), 32);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[4 + j], 0xF0) << j;
}

// Fills a row of `type` with valid random blocks (finite scales) for kernel tests.
std::vector<uint8_t> RandomRow(GgmlType type, size_t n, std::mt19937& rng) {
  std::vector<float> x = RandomVector(n, rng, 0.05f);
  std::vector<uint8_t> row(RowBytes(type, n));
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(row.data(), x.data(), n * 4);
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        if (type == GgmlType::kF16) {
          h = Fp32ToFp16(x[i]);
        } else {
          uint32_t b;
          std::memcpy(&b, &x[i], 4);
          h = b >> 16;
        }
        std::memcpy(row.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ4_0:
      QuantizeRowQ4_0(x.data(), row.data(), n);
      break;
    case GgmlType::kQ4_1:
      QuantizeRowQ4_1(x.data(), row.data(), n);
      break;
    case GgmlType::kQ8_0:
      QuantizeRowQ8_0(x.data(), row.data(), n);
      break;
    case GgmlType::kQ6_K: {
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& b : row) b = byte(rng);
      for (size_t blk = 0; blk < n / 256; ++blk) {  // sane d
        uint16_t d = Fp32ToFp16(0.001f * (1 + blk));
        std::memcpy(row.data() + blk * 210 + 208, &d, 2);
      }
      break;
    }
  }
  return row;
}

// Independent Q6_K decoder (element-indexed rather than loop-structured like ggml's).
float Q6KElement(const uint8_t* block, int i) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
  uint16_t dh;
  std::memcpy(&dh, block + 208, 2);
  int half = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
  uint8_t lbyte = ql[half * 64 + l + (quarter & 1) * 32];
  int low = quarter < 2 ? (lbyte & 0xF) : (lbyte >> 4);
  int high = (qh[half * 32 + l] >> (2 * quarter)) & 3;
  int scale = sc[half * 8 + l / 16 + 2 * quarter];
  return Fp16ToFp32(dh) * scale * ((low | (high << 4)) - 32);
}

TEST(QuantTest, Q6KDequantMatchesElementwiseDecoder) {
  std::mt19937 rng(3);
  std::vector<uint8_t> row = RandomRow(GgmlType::kQ6_K, 512, rng);
  std::vector<float> y(512);
  DequantizeRow(GgmlType::kQ6_K, row.data(), y.data(), 512);
  for (int i = 0; i < 512; ++i) {
    ASSERT_EQ(y[i], Q6KElement(row.data() + (i / 256) * 210, i % 256)) << i;
  }
}

class VecDotTest : public ::testing::TestWithParam<std::tuple<GgmlType, KernelIsa>> {};

// Tolerance: f32 accumulation in a different order than the f64 reference:
// |Δ| ≤ 1e-5 · Σ|w_i·x_i| + 1e-6.
TEST_P(VecDotTest, MatchesDequantizedDoubleReference) {
  auto [type, isa] = GetParam();
  if (isa == KernelIsa::kAvx2 && DetectKernelIsa() != KernelIsa::kAvx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(4);
  VecDotFn dot = GetVecDot(type, isa);
  for (size_t n : {256u, 512u, 768u, 1536u, 4096u}) {
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<uint8_t> row = RandomRow(type, n, rng);
      std::vector<float> x = RandomVector(n, rng);
      std::vector<float> w(n);
      DequantizeRow(type, row.data(), w.data(), n);
      double ref = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        ref += double(w[i]) * x[i];
        mag += std::fabs(double(w[i]) * x[i]);
      }
      float got = dot(row.data(), x.data(), n);
      ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-6) << "n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, VecDotTest,
    ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                         GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0,
                                         GgmlType::kQ6_K),
                       ::testing::Values(KernelIsa::kScalar, KernelIsa::kAvx2)));

TEST(VecDotSumsTest, MatchesThePlainKernelAndIsBitIdenticalAcrossRowCounts) {
  if (DetectKernelIsa() != KernelIsa::kAvx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(9);
  VecDotSumsFn dot = GetVecDotSums(GgmlType::kQ4_1, KernelIsa::kAvx2);
  VecDot4SumsFn dot4 = GetVecDot4Sums(GgmlType::kQ4_1, KernelIsa::kAvx2);
  ASSERT_NE(dot, nullptr);
  ASSERT_NE(dot4, nullptr);
  EXPECT_EQ(GetVecDotSums(GgmlType::kQ4_1, KernelIsa::kScalar), nullptr);
  EXPECT_EQ(GetVecDotSums(GgmlType::kQ8_0, KernelIsa::kAvx2), nullptr);
  VecDotFn plain = GetVecDot(GgmlType::kQ4_1, KernelIsa::kScalar);
  for (size_t n : {32u, 576u, 1536u}) {
    std::vector<uint8_t> row = RandomRow(GgmlType::kQ4_1, n, rng);
    std::vector<float> x = RandomVector(4 * n, rng), sums(4 * n / 32);
    for (int t = 0; t < 4; ++t) BlockSums(x.data() + t * n, n, sums.data() + t * n / 32);
    float out[4];
    dot4(row.data(), x.data(), sums.data(), n, n, out);
    for (int t = 0; t < 4; ++t) {
      const float one = dot(row.data(), x.data() + t * n, sums.data() + t * n / 32, n);
      EXPECT_EQ(one, out[t]) << "n=" << n << " t=" << t;
      const float ref = plain(row.data(), x.data() + t * n, n);
      EXPECT_NEAR(one, ref, 1e-4f * (1 + std::fabs(ref))) << "n=" << n;
    }
  }
}

TEST(AxpyTest, VectorAndScalarMatchAPlainLoop) {
  std::mt19937 rng(8);
  for (KernelIsa isa : {KernelIsa::kScalar, DetectKernelIsa()}) {
    for (size_t n : {1u, 7u, 8u, 64u, 67u}) {
      auto x = RandomVector(n, rng), y = RandomVector(n, rng), ref = y;
      GetAxpy(isa)(0.37f, x.data(), y.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], ref[i] + 0.37f * x[i], 1e-6f) << n;
    }
  }
}

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  std::mt19937 rng(5);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int iter = 0; iter < 300; ++iter) {
      size_t n = rng() % 200, grain = 1 + rng() % 20;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(
          n,
          [&](size_t b, size_t e) {
            for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
          },
          grain);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}

TEST(MatMulTest, IndependentOfThreadsAndBatchingAndCloseToReference) {
  std::mt19937 rng(6);
  const size_t rows = 200, cols = 576, tokens = 37;
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kF32}) {
    std::vector<uint8_t> data;
    for (size_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> row = RandomRow(type, cols, rng);
      data.insert(data.end(), row.begin(), row.end());
    }
    WeightMatrix w{type, data.data(), rows, cols, RowBytes(type, cols)};
    std::vector<float> x = RandomVector(tokens * cols, rng);
    KernelIsa isa = DetectKernelIsa();
    ThreadPool one(1), two(2);
    std::vector<float> y1(tokens * rows), y2(tokens * rows), ys(rows);
    MatMul(w, x.data(), tokens, y1.data(), one, isa);
    MatMul(w, x.data(), tokens, y2.data(), two, isa);
    ASSERT_EQ(y1, y2);
    std::vector<float> wrow(cols);
    for (size_t t = 0; t < tokens; ++t) {
      MatMul(w, x.data() + t * cols, 1, ys.data(), two, isa);
      for (size_t r = 0; r < rows; ++r) {
        ASSERT_EQ(ys[r], y1[t * rows + r]);
        DequantizeRow(type, w.Row(r), wrow.data(), cols);
        double ref = 0, mag = 0;
        for (size_t c = 0; c < cols; ++c) {
          ref += double(wrow[c]) * x[t * cols + c];
          mag += std::fabs(double(wrow[c]) * x[t * cols + c]);
        }
        ASSERT_NEAR(y1[t * rows + r], ref, 1e-5 * mag + 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::engine
