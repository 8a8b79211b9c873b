// Kernels of the synthetic decoder against straightforward host references.
// Tolerances: RMSNorm and SwiGLU outputs are bf16, compared within one bf16 ulp (2^-7 relative)
// of the f32 host value; RoPE within 1e-5 relative (sincosf/powf on both sides); argmax exact.

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::worker::kernels::cuda {
namespace {

using ::kvtier::testing::DeviceBuffer;

std::vector<float> Randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void ExpectBf16Near(uint16_t got, float want) {
  EXPECT_NEAR(Bf16BitsToF32(got), want, std::fabs(want) * (1.f / 128) + 1e-6f);
}

TEST(ModelOpsGpuTest, RmsNormMatchesHost) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t rows = 3, n = 3584;
  const std::vector<float> x = Randn(rows * n, 1);
  std::vector<uint16_t> w(n);
  for (uint32_t i = 0; i < n; ++i) w[i] = F32ToBf16Bits(0.5f + (i % 7) * 0.1f);
  DeviceBuffer<float> xd(x);
  DeviceBuffer<uint16_t> wd(w), out(rows * n);
  ASSERT_CUDA_OK(RmsNorm(xd.get(), wd.get(), rows, n, 1e-6f, out.get(), nullptr));
  const std::vector<uint16_t> got = out.Download();
  for (uint32_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (uint32_t i = 0; i < n; ++i) ss += double{x[r * n + i]} * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (uint32_t i = 0; i < n; ++i) {
      ExpectBf16Near(got[r * n + i], static_cast<float>(x[r * n + i] * inv * Bf16BitsToF32(w[i])));
    }
  }
}

TEST(ModelOpsGpuTest, SwiGluMatchesHost) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t batch = 2, ffn = 1000;
  const std::vector<float> gu = Randn(batch * 2 * ffn, 2);
  DeviceBuffer<float> gd(gu);
  DeviceBuffer<uint16_t> out(batch * ffn);
  ASSERT_CUDA_OK(SwiGlu(gd.get(), batch, ffn, out.get(), nullptr));
  const std::vector<uint16_t> got = out.Download();
  for (uint32_t b = 0; b < batch; ++b) {
    for (uint32_t i = 0; i < ffn; ++i) {
      const float g = gu[b * 2 * ffn + i], u = gu[b * 2 * ffn + ffn + i];
      ExpectBf16Near(got[b * ffn + i], g / (1.f + std::exp(-g)) * u);
    }
  }
}

TEST(ModelOpsGpuTest, ArgmaxPicksTheLowestIndexOfTheMaximum) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t rows = 4, vocab = 152064;
  std::vector<float> logits = Randn(rows * vocab, 3);
  logits[0 * vocab + 100000] = 50.f;
  logits[1 * vocab + 7] = 50.f;
  logits[1 * vocab + 9000] = 50.f;  // tie: 7 wins
  logits[2 * vocab + vocab - 1] = 50.f;
  DeviceBuffer<float> ld(logits);
  DeviceBuffer<int32_t> out(rows);
  ASSERT_CUDA_OK(ArgmaxRows(ld.get(), rows, vocab, out.get(), nullptr));
  const std::vector<int32_t> got = out.Download();
  EXPECT_EQ(got[0], 100000);
  EXPECT_EQ(got[1], 7);
  EXPECT_EQ(got[2], static_cast<int32_t>(vocab - 1));
  int32_t want = 0;
  for (uint32_t i = 0; i < vocab; ++i) {
    if (logits[3 * vocab + i] > logits[3 * vocab + want]) want = static_cast<int32_t>(i);
  }
  EXPECT_EQ(got[3], want);
}

TEST(ModelOpsGpuTest, RopeAppendRotatesQueriesAndWritesKvIntoThePage) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t batch = 2, qh = 4, kvh = 2, hd = 128, pt = 16;
  const uint32_t row = (qh + 2 * kvh) * hd;
  const std::vector<float> qkv = Randn(batch * row, 4);
  const std::vector<int32_t> pos = {5, 40};
  // Sequence b owns 3 pages; the token's page is pos / pt.
  DeviceBuffer<uint16_t> pages(batch * 3 * 2 * pt * kvh * hd);
  std::vector<void*> table;
  for (uint32_t i = 0; i < batch * 3; ++i) table.push_back(pages.get() + i * 2 * pt * kvh * hd);
  DeviceBuffer<void*> td(table);
  DeviceBuffer<int32_t> indptr(std::vector<int32_t>{0, 3, 6}), pd(pos);
  DeviceBuffer<float> qd(qkv), qout(batch * qh * hd);
  RopeAppendParams p;
  p.qkv = qd.get();
  p.positions = pd.get();
  p.q_out = qout.get();
  p.pages = td.get();
  p.page_indptr = indptr.get();
  p.page_tokens = pt;
  p.batch = batch;
  p.num_q_heads = qh;
  p.num_kv_heads = kvh;
  p.head_dim = hd;
  p.rope_base = 10000.f;
  ASSERT_CUDA_OK(RopeAppend(p, nullptr));
  const std::vector<float> q = qout.Download();
  const std::vector<uint16_t> kv = pages.Download();
  auto rotate = [&](const float* x, uint32_t j, int32_t position, float* a, float* c) {
    const double f = std::pow(10000.0, -2.0 * j / hd), ang = position * f;
    *a = static_cast<float>(x[j] * std::cos(ang) - x[j + hd / 2] * std::sin(ang));
    *c = static_cast<float>(x[j + hd / 2] * std::cos(ang) + x[j] * std::sin(ang));
  };
  for (uint32_t b = 0; b < batch; ++b) {
    const float* src = qkv.data() + b * row;
    for (uint32_t h = 0; h < qh; ++h) {
      for (uint32_t j = 0; j < hd / 2; ++j) {
        float a, c;
        rotate(src + h * hd, j, pos[b], &a, &c);
        EXPECT_NEAR(q[(b * qh + h) * hd + j], a, 1e-4 + 1e-4 * std::fabs(a));
        EXPECT_NEAR(q[(b * qh + h) * hd + j + hd / 2], c, 1e-4 + 1e-4 * std::fabs(c));
      }
    }
    const uint64_t page = b * 3 + pos[b] / pt;
    const uint64_t k_row = page * 2 * pt * kvh * hd + (pos[b] % pt) * kvh * hd;
    const uint64_t v_row = k_row + pt * kvh * hd;
    for (uint32_t h = 0; h < kvh; ++h) {
      for (uint32_t j = 0; j < hd / 2; ++j) {
        float a, c;
        rotate(src + (qh + h) * hd, j, pos[b], &a, &c);
        ExpectBf16Near(kv[k_row + h * hd + j], a);
        ExpectBf16Near(kv[k_row + h * hd + j + hd / 2], c);
        EXPECT_EQ(kv[v_row + h * hd + j], F32ToBf16Bits(src[(qh + kvh + h) * hd + j]));
      }
    }
  }
}

// The rows mode (what the decoder hands the tiered store): the same rotation, f32 K and V rows
// [batch][kv_heads][head_dim], and the same queries as the page-table mode.
TEST(ModelOpsGpuTest, RopeAppendWritesF32RowsWhenGivenThem) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint32_t batch = 3, qh = 8, kvh = 2, hd = 64;
  const uint32_t row = (qh + 2 * kvh) * hd;
  const std::vector<float> qkv = Randn(batch * row, 5);
  const std::vector<int32_t> pos = {0, 17, 700};
  DeviceBuffer<int32_t> pd(pos);
  DeviceBuffer<float> qd(qkv), qout(batch * qh * hd), k(batch * kvh * hd), v(batch * kvh * hd);
  RopeAppendParams p;
  p.qkv = qd.get();
  p.positions = pd.get();
  p.q_out = qout.get();
  p.k_out = k.get();
  p.batch = batch;
  p.num_q_heads = qh;
  p.num_kv_heads = kvh;
  p.head_dim = hd;
  p.rope_base = 10000.f;
  EXPECT_EQ(RopeAppend(p, nullptr), cudaErrorInvalidValue);  // k_out without v_out
  p.v_out = v.get();
  ASSERT_CUDA_OK(RopeAppend(p, nullptr));
  const std::vector<float> q = qout.Download(), hk = k.Download(), hv = v.Download();
  for (uint32_t b = 0; b < batch; ++b) {
    const float* src = qkv.data() + b * row;
    for (uint32_t h = 0; h < qh + kvh; ++h) {
      const float* got = h < qh ? &q[(b * qh + h) * hd] : &hk[(b * kvh + h - qh) * hd];
      for (uint32_t j = 0; j < hd / 2; ++j) {
        const double ang = pos[b] * std::pow(10000.0, -2.0 * j / hd);
        const double a = src[h * hd + j] * std::cos(ang) - src[h * hd + j + hd / 2] * std::sin(ang);
        const double c = src[h * hd + j + hd / 2] * std::cos(ang) + src[h * hd + j] * std::sin(ang);
        EXPECT_NEAR(got[j], a, 1e-4 + 1e-4 * std::fabs(a)) << "b " << b << " head " << h;
        EXPECT_NEAR(got[j + hd / 2], c, 1e-4 + 1e-4 * std::fabs(c)) << "b " << b << " head " << h;
      }
    }
    for (uint32_t i = 0; i < kvh * hd; ++i) {  // V is copied, not rotated
      ASSERT_EQ(hv[b * kvh * hd + i], src[(qh + kvh) * hd + i]) << "b " << b << " i " << i;
    }
  }
}

TEST(ModelOpsGpuTest, HashFillF32IsDeterministicBoundedAndRoundsToTheBf16Fill) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint64_t n = 1 << 16;
  DeviceBuffer<float> a(n), b(n), c(n);
  DeviceBuffer<uint16_t> h16(n);
  ASSERT_CUDA_OK(FillHashF32(a.get(), n, 7, 0.5f, nullptr));
  ASSERT_CUDA_OK(FillHashF32(b.get(), n, 7, 0.5f, nullptr));
  ASSERT_CUDA_OK(FillHashF32(c.get(), n, 8, 0.5f, nullptr));
  ASSERT_CUDA_OK(FillHashBf16(h16.get(), n, 7, 0.5f, nullptr));
  const std::vector<float> ha = a.Download(), hb = b.Download(), hc = c.Download();
  const std::vector<uint16_t> bf = h16.Download();
  EXPECT_EQ(ha, hb);
  EXPECT_NE(ha, hc);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(ha[i]), 0.5f);
    ASSERT_EQ(F32ToBf16Bits(ha[i]), bf[i]) << i;  // the same draw, before rounding
  }
}

TEST(ModelOpsGpuTest, HashFillIsDeterministicAndBounded) {
  KVTIER_SKIP_WITHOUT_GPU();
  const uint64_t n = 1 << 20;
  DeviceBuffer<uint16_t> a(n), b(n), c(n);
  ASSERT_CUDA_OK(FillHashBf16(a.get(), n, 7, 0.5f, nullptr));
  ASSERT_CUDA_OK(FillHashBf16(b.get(), n, 7, 0.5f, nullptr));
  ASSERT_CUDA_OK(FillHashBf16(c.get(), n, 8, 0.5f, nullptr));
  const std::vector<uint16_t> ha = a.Download(), hb = b.Download(), hc = c.Download();
  EXPECT_EQ(ha, hb);
  EXPECT_NE(ha, hc);
  double sum = 0;
  for (uint16_t h : ha) {
    const float x = Bf16BitsToF32(h);
    ASSERT_LE(std::fabs(x), 0.5f);
    sum += x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
}

TEST(ModelOpsGpuTest, AdvancePositionsKeepsLengthOnePastThePosition) {
  KVTIER_SKIP_WITHOUT_GPU();
  DeviceBuffer<int32_t> pos(std::vector<int32_t>{0, 9}), len(std::vector<int32_t>{1, 10});
  ASSERT_CUDA_OK(AdvancePositions(pos.get(), len.get(), 2, nullptr));
  EXPECT_EQ(pos.Download(), (std::vector<int32_t>{1, 10}));
  EXPECT_EQ(len.Download(), (std::vector<int32_t>{2, 11}));
  ASSERT_CUDA_OK(AdvancePositions(pos.get(), nullptr, 2, nullptr));  // lengths kept elsewhere
  EXPECT_EQ(pos.Download(), (std::vector<int32_t>{2, 11}));
  EXPECT_EQ(len.Download(), (std::vector<int32_t>{2, 11}));
}

}  // namespace
}  // namespace kvtier::worker::kernels::cuda
