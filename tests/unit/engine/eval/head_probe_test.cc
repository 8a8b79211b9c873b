#include "engine/eval/head_probe.h"

#include <random>

#include "engine/dense_attention_cache.h"
#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

constexpr worker::AttentionShape kShape{
    .num_layers = 2, .num_q_heads = 6, .num_kv_heads = 2, .head_dim = 8, .scale = 0.35f};

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The probe's per-head rows, summed over heads, are the cache's position mass (the kernel's
// own softmax), for prefill and decode, at random shapes.
TEST(HeadProbeCache, RowsSumToTheCachesPositionMass) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 10; ++trial) {
    DenseAttentionCache dense(kShape);
    HeadProbeCache probe(kShape, &dense, 64);
    const uint32_t kvd = kShape.num_kv_heads * kShape.head_dim;
    const uint32_t qd = kShape.num_q_heads * kShape.head_dim;
    const uint32_t prompt = 3 + trial, steps = 4;
    for (uint32_t step = 0; step <= steps; ++step) {
      const uint32_t n = step == 0 ? prompt : 1;
      for (uint32_t l = 0; l < kShape.num_layers; ++l) {
        auto k = Random(rng, n * kvd), v = Random(rng, n * kvd), q = Random(rng, n * qd);
        ASSERT_TRUE(probe.Append(l, k.data(), v.data(), n).ok());
        std::vector<float> out(n * qd), mass(probe.Length(l));
        ASSERT_TRUE(probe.Attend(l, q.data(), n, out.data(), mass.data()).ok());
        if (l + 1 < kShape.num_layers) continue;
        std::vector<float> rows;
        probe.ComputeRows(n, rows);
        const uint32_t L = probe.Length(l);
        for (uint32_t p = 0; p < L; ++p) {
          double sum = 0;
          for (uint32_t h = 0; h < kShape.num_q_heads; ++h) {
            for (uint32_t r = 0; r < n; ++r) {
              sum += rows[((size_t{l} * kShape.num_q_heads + h) * n + r) * L + p];
            }
          }
          EXPECT_NEAR(sum, mass[p], 1e-4) << "trial " << trial << " step " << step << " p " << p;
        }
      }
    }
  }
}

TEST(HeadProbeCache, DroppedPositionsGetNoAttentionAndRowsRenormalise) {
  DenseAttentionCache dense(kShape);
  HeadProbeCache probe(kShape, &dense, 4);
  std::mt19937 rng(3);
  const uint32_t n = 6, kvd = kShape.num_kv_heads * kShape.head_dim;
  for (uint32_t l = 0; l < kShape.num_layers; ++l) {
    auto k = Random(rng, n * kvd), v = Random(rng, n * kvd);
    auto q = Random(rng, n * kShape.num_q_heads * kShape.head_dim);
    ASSERT_TRUE(probe.Append(l, k.data(), v.data(), n).ok());
    std::vector<float> out(n * kShape.num_q_heads * kShape.head_dim);
    ASSERT_TRUE(probe.Attend(l, q.data(), n, out.data(), nullptr).ok());
  }
  probe.Drop(1, 0, 2);
  std::vector<float> rows;
  probe.ComputeRows(1, rows);
  const uint32_t L = n;
  for (uint32_t h = 0; h < kShape.num_q_heads; ++h) {
    const float* row = rows.data() + (size_t{1} * kShape.num_q_heads + h) * L;
    double sum = 0;
    for (uint32_t p = 0; p < L; ++p) sum += row[p];
    EXPECT_NEAR(sum, 1.0, 1e-5);
    const uint32_t kv = h / (kShape.num_q_heads / kShape.num_kv_heads);
    if (kv == 0) {
      EXPECT_EQ(row[2], 0.f);
    } else {
      EXPECT_GT(row[2], 0.f);
    }
  }
}

}  // namespace
}  // namespace kvtier::engine
