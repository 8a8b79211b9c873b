#include "engine/dense_attention_cache.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

worker::AttentionShape Shape(uint32_t layers, uint32_t hq, uint32_t hkv, uint32_t d) {
  return {layers, hq, hkv, d, 1.f / std::sqrt(float(d))};
}

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Straightforward double-precision causal GQA attention over all `len` positions.
void Reference(const worker::AttentionShape& s, const std::vector<float>& k,
               const std::vector<float>& v, const float* q, uint32_t n, uint32_t len,
               std::vector<double>& out, std::vector<double>& mass) {
  const uint32_t group = s.num_q_heads / s.num_kv_heads, d = s.head_dim;
  out.assign(size_t{n} * s.num_q_heads * d, 0);
  mass.assign(len, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t p = len - n + i;
    for (uint32_t h = 0; h < s.num_q_heads; ++h) {
      const uint32_t kvh = h / group;
      std::vector<double> w(p + 1);
      double mx = -INFINITY, sum = 0;
      for (uint32_t j = 0; j <= p; ++j) {
        double dot = 0;
        for (uint32_t c = 0; c < d; ++c) {
          dot += double(q[(i * s.num_q_heads + h) * d + c]) * k[(j * s.num_kv_heads + kvh) * d + c];
        }
        w[j] = dot * s.scale;
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (uint32_t j = 0; j <= p; ++j) {
        mass[j] += w[j] / sum;
        for (uint32_t c = 0; c < d; ++c) {
          out[(i * s.num_q_heads + h) * d + c] +=
              w[j] / sum * v[(j * s.num_kv_heads + kvh) * d + c];
        }
      }
    }
  }
}

TEST(DenseAttentionCacheTest, MatchesDoubleReferenceOverRandomShapes) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  for (int trial = 0; trial < 30; ++trial) {
    const uint32_t hkv = 1 + rng() % 3, group = 1 + rng() % 3, d = 8 * (1 + rng() % 8);
    const auto shape = Shape(2, hkv * group, hkv, d);
    DenseAttentionCache cache(shape, trial % 2 ? &pool : nullptr);
    std::vector<float> k_all, v_all;
    uint32_t len = 0;
    for (int chunk = 0; chunk < 3; ++chunk) {
      const uint32_t n = 1 + rng() % 7;
      auto k = Random(size_t{n} * hkv * d, rng), v = Random(size_t{n} * hkv * d, rng);
      auto q = Random(size_t{n} * shape.num_q_heads * d, rng);
      ASSERT_TRUE(cache.Append(1, k.data(), v.data(), n).ok());
      k_all.insert(k_all.end(), k.begin(), k.end());
      v_all.insert(v_all.end(), v.begin(), v.end());
      len += n;
      ASSERT_EQ(cache.Length(1), len);
      ASSERT_EQ(cache.Length(0), 0u);
      std::vector<float> out(q.size()), mass(len);
      ASSERT_TRUE(cache.Attend(1, q.data(), n, out.data(), mass.data()).ok());
      std::vector<double> ref_out, ref_mass;
      Reference(shape, k_all, v_all, q.data(), n, len, ref_out, ref_mass);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref_out[i], 1e-4) << i;
      double total = 0;
      for (uint32_t j = 0; j < len; ++j) {
        ASSERT_NEAR(mass[j], ref_mass[j], 1e-4) << j;
        total += mass[j];
      }
      EXPECT_NEAR(total, double(n) * shape.num_q_heads, 1e-3);
    }
  }
}

TEST(DenseAttentionCacheTest, QueriesNeverSeeLaterPositions) {
  std::mt19937 rng(2);
  const auto shape = Shape(1, 2, 1, 16);
  DenseAttentionCache a(shape), b(shape);
  auto k = Random(4 * 16, rng), v = Random(4 * 16, rng), q = Random(4 * 2 * 16, rng);
  ASSERT_TRUE(a.Append(0, k.data(), v.data(), 4).ok());
  std::vector<float> out4(q.size()), mass(4);
  ASSERT_TRUE(a.Attend(0, q.data(), 4, out4.data(), mass.data()).ok());
  // The first query attends to position 0 only: its output is v[0] for both heads.
  for (int c = 0; c < 16; ++c) {
    EXPECT_FLOAT_EQ(out4[c], v[c]);
    EXPECT_FLOAT_EQ(out4[16 + c], v[c]);
  }
  // Query 2 of 4 equals a single query over the first 3 positions.
  ASSERT_TRUE(b.Append(0, k.data(), v.data(), 3).ok());
  std::vector<float> out1(2 * 16);
  ASSERT_TRUE(b.Attend(0, q.data() + 2 * 2 * 16, 1, out1.data(), nullptr).ok());
  for (int c = 0; c < 32; ++c) EXPECT_EQ(out1[c], out4[2 * 32 + c]);
}

TEST(DenseAttentionCacheTest, ThreadPoolDoesNotChangeOutputOrMass) {
  std::mt19937 rng(3);
  const auto shape = Shape(1, 9, 3, 64);
  ThreadPool pool(2);
  DenseAttentionCache a(shape), b(shape, &pool);
  const uint32_t n = 37;
  auto k = Random(n * 3 * 64, rng), v = Random(n * 3 * 64, rng), q = Random(n * 9 * 64, rng);
  ASSERT_TRUE(a.Append(0, k.data(), v.data(), n).ok());
  ASSERT_TRUE(b.Append(0, k.data(), v.data(), n).ok());
  std::vector<float> oa(q.size()), ob(q.size()), ma(n), mb(n);
  ASSERT_TRUE(a.Attend(0, q.data(), n, oa.data(), ma.data()).ok());
  ASSERT_TRUE(b.Attend(0, q.data(), n, ob.data(), mb.data()).ok());
  EXPECT_EQ(oa, ob);
  EXPECT_EQ(ma, mb);
}

TEST(DenseAttentionCacheTest, RejectsBadArguments) {
  DenseAttentionCache cache(Shape(2, 4, 2, 8), nullptr, /*max_positions=*/3);
  std::vector<float> kv(4 * 2 * 8), q(4 * 4 * 8), out(q.size());
  EXPECT_EQ(cache.Append(2, kv.data(), kv.data(), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Attend(0, q.data(), 1, out.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // nothing cached yet
  EXPECT_EQ(cache.Append(0, kv.data(), kv.data(), 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(cache.Append(0, kv.data(), kv.data(), 3).ok());
  EXPECT_EQ(cache.bytes(), 2u * 3 * 2 * 8 * 4);
}

}  // namespace
}  // namespace kvtier::engine
