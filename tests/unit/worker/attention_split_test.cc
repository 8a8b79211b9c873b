// Split attention: the positions of one decode step attended in two parts (pages "staged" and
// pages left "in place" in DDR) and merged by log-sum-exp, against the unsplit kernel.
// Bounds (fp32, errors relative to the largest |output| of their head: an element near 0 has no
// relative digits): split and unsplit within 1e-6 (issue #17's bound); against the same
// attention in f64, the split output's error at most twice the unsplit kernel's own plus 1e-6
// (each part rounds like the whole; the merge adds ~1 ulp). The 1e-6 bound holds at 16K
// positions because the kernel sums in fixed spans of 256 positions merged by log-sum-exp (it
// is ~1e-6 from f64 there; a single running sum was ~4e-6 from it, and no split of such a sum
// could stay within 1e-6). Log-sum-exp within 1e-6 relative, each position's mass within 1e-6.
// Figures in docs/scheduling.md.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kernels/attention_merge.h"
#include "worker/kernels/task_runner.h"

namespace kvtier::worker::kernels {
namespace {

struct Cache {
  uint32_t q_heads, kv_heads, head_dim, length;
  std::vector<float> q, kv;
  std::vector<const float*> k_rows, v_rows;
};

Cache MakeCache(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, uint32_t length,
                uint32_t seed, double evict_p) {
  Cache c{q_heads, kv_heads, head_dim, length};
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::bernoulli_distribution evict(evict_p);
  const size_t row = size_t{kv_heads} * head_dim;
  c.q.resize(size_t{q_heads} * head_dim);
  for (float& x : c.q) x = 2 * n(rng);  // peaked softmaxes as well as flat ones
  c.kv.resize(size_t{length} * 2 * row);
  for (float& x : c.kv) x = n(rng);
  for (uint32_t p = 0; p < length; ++p) {
    const bool gone = evict(rng);
    c.k_rows.push_back(gone ? nullptr : c.kv.data() + 2 * row * p);
    c.v_rows.push_back(gone ? nullptr : c.kv.data() + 2 * row * p + row);
  }
  return c;
}

struct Result {
  std::vector<float> out, lse, mass, head_mass;
};

// Claims two threads but runs tasks on the caller in reverse order: the threaded path, with a
// task order that would show any dependence on it.
class ReverseRunner final : public TaskRunner {
 public:
  int concurrency() const override { return 2; }
  void Run(uint32_t n, const std::function<void(uint32_t)>& task) override {
    for (uint32_t i = n; i-- > 0;) task(i);
  }
};

// Attention over the positions where `take` is true (all when empty), one query at the end.
Result Attend(const Cache& c, const std::vector<bool>& take, TaskRunner* runner = nullptr) {
  std::vector<const float*> k = c.k_rows, v = c.v_rows;
  for (uint32_t p = 0; p < c.length && !take.empty(); ++p) {
    if (!take[p]) k[p] = v[p] = nullptr;
  }
  Result r;
  r.out.resize(size_t{c.q_heads} * c.head_dim);
  r.lse.resize(c.q_heads);
  r.mass.resize(c.length);
  r.head_mass.resize(size_t{c.q_heads} * c.length);
  std::vector<float> scratch(AttentionScratchFloats(c.q_heads, c.length));
  AttentionParams p;
  p.q = c.q.data();
  p.out = r.out.data();
  p.position_mass = r.mass.data();
  p.lse = r.lse.data();
  p.head_mass = r.head_mass.data();
  p.k_rows = k.data();
  p.v_rows = v.data();
  p.length = c.length;
  p.num_queries = 1;
  p.num_q_heads = c.q_heads;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  p.scratch = scratch.data();
  p.runner = runner;
  Attention(p);
  return r;
}

// Pages of `page` positions, each in place with probability `in_place_p`.
std::vector<bool> InPlacePages(uint32_t length, uint32_t page, double in_place_p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution in_place(in_place_p);
  std::vector<bool> mask(length);
  for (uint32_t b = 0; b < length; b += page) {
    const bool where = in_place(rng);
    for (uint32_t p = b; p < std::min(length, b + page); ++p) mask[p] = where;
  }
  return mask;
}

// The same attention in f64, position order: what both f32 results are rounded from.
std::vector<double> Exact(const Cache& c) {
  const uint32_t group = c.q_heads / c.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::vector<double> out(size_t{c.q_heads} * c.head_dim, 0.0);
  for (uint32_t h = 0; h < c.q_heads; ++h) {
    const size_t kv = size_t{h / group} * c.head_dim;
    std::vector<double> s(c.length, -INFINITY);
    double m = -INFINITY;
    for (uint32_t p = 0; p < c.length; ++p) {
      if (c.k_rows[p] == nullptr) continue;
      double dot = 0;
      for (uint32_t j = 0; j < c.head_dim; ++j) {
        dot += double{c.q[h * c.head_dim + j]} * c.k_rows[p][kv + j];
      }
      s[p] = dot * scale;
      m = std::max(m, s[p]);
    }
    double z = 0;
    for (uint32_t p = 0; p < c.length; ++p) z += c.k_rows[p] ? std::exp(s[p] - m) : 0.0;
    for (uint32_t p = 0; p < c.length; ++p) {
      if (c.v_rows[p] == nullptr) continue;
      const double w = std::exp(s[p] - m) / z;
      for (uint32_t j = 0; j < c.head_dim; ++j) out[h * c.head_dim + j] += w * c.v_rows[p][kv + j];
    }
  }
  return out;
}

struct Worst {
  double out = 0, lse = 0, mass = 0, mass_sum = 0;
  double split_vs_exact = 0, whole_vs_exact = 0;  // the two f32 results against f64
};

Worst Compare(const Cache& c, const std::vector<bool>& in_place) {
  std::vector<bool> staged(in_place.size());
  for (size_t i = 0; i < in_place.size(); ++i) staged[i] = !in_place[i];
  const Result whole = Attend(c, {});
  const Result a = Attend(c, staged), b = Attend(c, in_place);
  const AttentionPartial parts[] = {{a.out.data(), a.lse.data(), a.head_mass.data()},
                                    {b.out.data(), b.lse.data(), b.head_mass.data()}};
  std::vector<float> out(whole.out.size()), lse(c.q_heads), mass(c.length);
  MergeAttentionPartials(parts, {1, c.q_heads, c.head_dim, c.length}, out.data(), lse.data(),
                         mass.data());
  Worst w;
  const std::vector<double> exact = Exact(c);
  for (uint32_t h = 0; h < c.q_heads; ++h) {
    // Relative to the head's output scale (an output element near 0 has no relative digits).
    double scale = 0;
    for (uint32_t j = 0; j < c.head_dim; ++j) {
      scale = std::max(scale, std::fabs(double{whole.out[h * c.head_dim + j]}));
    }
    for (uint32_t j = 0; j < c.head_dim; ++j) {
      const size_t i = size_t{h} * c.head_dim + j;
      w.out = std::max(w.out, std::fabs(double{out[i]} - whole.out[i]) / scale);
      w.split_vs_exact = std::max(w.split_vs_exact, std::fabs(out[i] - exact[i]) / scale);
      w.whole_vs_exact = std::max(w.whole_vs_exact, std::fabs(whole.out[i] - exact[i]) / scale);
    }
    w.lse = std::max(w.lse, std::fabs(double{lse[h]} - whole.lse[h]) /
                                std::max(1.0, std::fabs(double{whole.lse[h]})));
  }
  double total = 0;
  for (uint32_t p = 0; p < c.length; ++p) {
    w.mass = std::max(w.mass, std::fabs(double{mass[p]} - whole.mass[p]));
    total += mass[p];
  }
  w.mass_sum = std::fabs(total - c.q_heads);  // each live head's weights sum to 1
  return w;
}

TEST(AttentionSplitTest, MergedPartsMatchTheWholeAttention) {
  for (uint32_t length : {7u, 100u, 1000u, 16384u}) {
    for (double in_place_p : {0.0, 0.3, 0.7, 1.0}) {
      const Cache c = MakeCache(9, 3, 64, length, length, 0.05);
      const Worst w = Compare(c, InPlacePages(length, 16, in_place_p, length + 1));
      SCOPED_TRACE(testing::Message() << "length " << length << " in place " << in_place_p);
      std::printf(
          "length %5u, %3.0f%% in place: |split - unsplit| %.2e, |split - f64| %.2e, "
          "|unsplit - f64| %.2e\n",
          length, 100 * in_place_p, w.out, w.split_vs_exact, w.whole_vs_exact);
      EXPECT_LE(w.split_vs_exact, 2 * w.whole_vs_exact + 1e-6);
      EXPECT_LE(w.out, 3 * w.whole_vs_exact + 1e-6);
      EXPECT_LE(w.out, 1e-6) << "the issue's bound, which the span kernel meets";
      EXPECT_LE(w.lse, 1e-6);
      EXPECT_LE(w.mass, 1e-6);
      EXPECT_LE(w.mass_sum, 1e-4);
    }
  }
}

TEST(AttentionSplitTest, RandomShapesAndSplitsStayWithinTheBound) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 60; ++trial) {
    const uint32_t kv_heads = 1 + rng() % 4, group = 1 + rng() % 4;
    const uint32_t head_dim = 8 * (1 + rng() % 16), length = 1 + rng() % 3000;
    const Cache c = MakeCache(kv_heads * group, kv_heads, head_dim, length, trial, 0.1);
    const Worst w = Compare(c, InPlacePages(length, 1 + rng() % 32, 0.5, trial));
    SCOPED_TRACE(testing::Message() << "trial " << trial << " length " << length);
    EXPECT_LE(w.split_vs_exact, 2 * w.whole_vs_exact + 1e-6);
    EXPECT_LE(w.out, 3 * w.whole_vs_exact + 1e-6);
    EXPECT_LE(w.out, 1e-6);
    EXPECT_LE(w.lse, 1e-6);
    EXPECT_LE(w.mass, 1e-6);
  }
}

TEST(AttentionSplitTest, ThreadedKernelGivesTheSameLseAndHeadWeights) {
  const Cache c = MakeCache(9, 3, 64, 2051, 4, 0.1);
  const std::vector<bool> half = InPlacePages(2051, 16, 0.5, 4);
  ReverseRunner runner;
  const Result serial = Attend(c, half), threaded = Attend(c, half, &runner);
  EXPECT_EQ(serial.out, threaded.out);
  EXPECT_EQ(serial.lse, threaded.lse);
  EXPECT_EQ(serial.head_mass, threaded.head_mass);
  EXPECT_EQ(serial.mass, threaded.mass);
}

TEST(AttentionSplitTest, APartWithNothingLiveContributesNothing) {
  const Cache c = MakeCache(4, 2, 16, 50, 9, 0);
  const std::vector<bool> none(50, false), all(50, true);
  const Result whole = Attend(c, {}), empty = Attend(c, none), full = Attend(c, all);
  for (float l : empty.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  const AttentionPartial parts[] = {{empty.out.data(), empty.lse.data(), empty.head_mass.data()},
                                    {full.out.data(), full.lse.data(), full.head_mass.data()}};
  std::vector<float> out(whole.out.size()), mass(50);
  MergeAttentionPartials(parts, {1, 4, 16, 50}, out.data(), nullptr, mass.data());
  EXPECT_EQ(out, whole.out);  // weight 1 and 0 exactly: bit-identical
  EXPECT_EQ(mass, whole.mass);
}

}  // namespace
}  // namespace kvtier::worker::kernels
