#include "engine/eval/head_probe.h"

#include <cmath>
#include <random>

#include "engine/dense_attention_cache.h"
#include "engine/thread_pool.h"
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

// Probes fed one prefill (AttendShared) take rows another computed from SharedProbeRows: the
// same floats as their own computation; a probe that dropped a position or attended for itself
// computes its own; rows computed on two threads are the same. Also: the rows are the scalar
// definition (float dot in order, double softmax) bit for bit, at a head_dim and lengths that
// are not multiples of the vector width.
TEST(HeadProbeCache, SharedRowsAreTheProbesOwnAndStopAtTheFirstDrop) {
  constexpr worker::AttentionShape shape{
      .num_layers = 2, .num_q_heads = 4, .num_kv_heads = 2, .head_dim = 7, .scale = 0.4f};
  std::mt19937 rng(5);
  const uint32_t n = 21, kvd = shape.num_kv_heads * shape.head_dim;  // 2 blocks of 8 and 5
  const uint32_t qd = shape.num_q_heads * shape.head_dim;
  DenseAttentionCache d1(shape), d2(shape), d3(shape);
  SharedProbeRows shared;
  HeadProbeCache a(shape, &d1, n), b(shape, &d2, n), own(shape, &d3, n);
  ThreadPool pool(2);
  own.SetTaskRunner(&pool);  // `own` computes its rows over the layers on two threads
  own.SetTaskRunner(nullptr);
  a.set_shared_rows(&shared);
  b.set_shared_rows(&shared);
  std::vector<std::vector<float>> keys, queries;
  for (uint32_t l = 0; l < shape.num_layers; ++l) {
    auto k = Random(rng, n * kvd), v = Random(rng, n * kvd), q = Random(rng, n * qd);
    for (HeadProbeCache* p : {&a, &b, &own}) {
      ASSERT_TRUE(p->Append(l, k.data(), v.data(), n).ok());
      p->AttendShared(l, q.data(), n);
    }
    keys.push_back(k);
    queries.push_back(q);
  }
  std::vector<float> ra, rb, rown, sa, sb, sown;
  a.ColumnSums(sa);
  a.ComputeRows(5, ra);
  own.ColumnSums(sown);
  own.ComputeRows(3, rown);
  EXPECT_EQ(sa, sown);
  EXPECT_EQ(shared.rows, 5u);
  shared.sums_data.assign(shared.sums_data.size(), -1.f);  // poison: b must read the share
  b.ColumnSums(sb);
  EXPECT_EQ(sb, shared.sums_data);
  b.ComputeRows(3, rb);
  EXPECT_EQ(rb, rown);
  // The scalar definition, query n-1 (the last row of rown), every layer and head.
  for (uint32_t l = 0; l < shape.num_layers; ++l) {
    for (uint32_t h = 0; h < shape.num_q_heads; ++h) {
      const uint32_t kv = h / (shape.num_q_heads / shape.num_kv_heads);
      std::vector<float> logits(n);
      double m = -INFINITY, sum = 0;
      for (uint32_t p = 0; p < n; ++p) {
        float s = 0;
        for (uint32_t d = 0; d < shape.head_dim; ++d) {
          s += queries[l][(n - 1) * qd + h * shape.head_dim + d] *
               keys[l][p * kvd + kv * shape.head_dim + d];
        }
        logits[p] = s * shape.scale;
        m = std::max(m, double{logits[p]});
      }
      std::vector<float> expect(n);
      for (uint32_t p = 0; p < n; ++p) {
        const double e = std::exp(logits[p] - m);
        expect[p] = static_cast<float>(e);
        sum += e;
      }
      for (float& x : expect) x = static_cast<float>(x / sum);
      const float* got = rown.data() + ((size_t{l} * shape.num_q_heads + h) * 3 + 2) * n;
      EXPECT_EQ(std::vector<float>(got, got + n), expect) << "layer " << l << " head " << h;
    }
  }
  // After a drop, b computes its own rows (renormalised without the position).
  b.Drop(0, 0, 4);
  own.Drop(0, 0, 4);
  b.ComputeRows(2, rb);
  own.ComputeRows(2, rown);
  EXPECT_EQ(rb, rown);
  EXPECT_EQ(rb[4], 0.f);
}

}  // namespace
}  // namespace kvtier::engine
