#include "worker/kernels/attention_cpu.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::worker::kernels {
namespace {

struct Shape {
  uint32_t q_heads, kv_heads, head_dim, length, n;
};

// A cache of `length` positions as separately allocated rows, some evicted, optionally masked.
struct Case {
  Shape s;
  std::vector<float> q, kv;  // kv: [length][2][kv_heads][head_dim]
  std::vector<const float*> k_rows, v_rows;
  std::vector<std::vector<uint8_t>> keep;
  std::vector<const uint8_t*> keep_ptrs;
  uint32_t window = 0;  // AttentionParams' window and softcap (0 = none)
  float softcap = 0.f;

  Case(Shape shape, uint32_t seed, double evict_p, double mask_p) : s(shape) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    std::bernoulli_distribution evict(evict_p), mask(mask_p);
    const size_t row = size_t{s.kv_heads} * s.head_dim;
    q.resize(size_t{s.n} * s.q_heads * s.head_dim);
    for (float& x : q) x = n(rng);
    kv.resize(size_t{s.length} * 2 * row);
    for (float& x : kv) x = n(rng);
    for (uint32_t p = 0; p < s.length; ++p) {
      const bool gone = evict(rng);
      k_rows.push_back(gone ? nullptr : kv.data() + 2 * row * p);
      v_rows.push_back(gone ? nullptr : kv.data() + 2 * row * p + row);
    }
    if (mask_p > 0) {
      keep.assign(s.kv_heads, std::vector<uint8_t>(s.length));
      for (auto& k : keep) {
        for (auto& b : k) b = mask(rng) ? 0 : 1;
      }
      for (auto& k : keep) keep_ptrs.push_back(k.data());
    }
  }

  AttentionParams Params(float* out, float* mass, std::vector<float>& scratch) const {
    scratch.assign(AttentionScratchFloats(s.q_heads, s.length), 0.f);
    AttentionParams p;
    p.q = q.data();
    p.out = out;
    p.position_mass = mass;
    p.k_rows = k_rows.data();
    p.v_rows = v_rows.data();
    p.keep = keep.empty() ? nullptr : keep_ptrs.data();
    p.length = s.length;
    p.num_queries = s.n;
    p.num_q_heads = s.q_heads;
    p.num_kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    p.window = window;
    p.softcap = softcap;
    p.scratch = scratch.data();
    return p;
  }

  // Straightforward double-precision attention.
  void Reference(std::vector<double>& out, std::vector<double>& mass) const {
    const uint32_t group = s.q_heads / s.kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    out.assign(size_t{s.n} * s.q_heads * s.head_dim, 0.0);
    mass.assign(s.length, 0.0);
    for (uint32_t t = 0; t < s.n; ++t) {
      const uint32_t last = s.length - s.n + t;
      for (uint32_t h = 0; h < s.q_heads; ++h) {
        const uint32_t kvh = h / group;
        const float* qh = q.data() + (size_t{t} * s.q_heads + h) * s.head_dim;
        std::vector<double> w(last + 1, 0.0);
        double m = -INFINITY;
        std::vector<bool> live(last + 1, false);
        for (uint32_t p = 0; p <= last; ++p) {
          live[p] = k_rows[p] != nullptr && (keep.empty() || keep[kvh][p]) &&
                    (window == 0 || p + window > last);
          if (!live[p]) continue;
          double d = 0;
          for (uint32_t i = 0; i < s.head_dim; ++i) {
            d += double{qh[i]} * k_rows[p][kvh * s.head_dim + i];
          }
          w[p] = d * scale;
          if (softcap != 0.f) w[p] = softcap * std::tanh(w[p] / softcap);
          m = std::max(m, w[p]);
        }
        double z = 0;
        for (uint32_t p = 0; p <= last; ++p) z += live[p] ? std::exp(w[p] - m) : 0.0;
        for (uint32_t p = 0; p <= last; ++p) {
          const double a = live[p] ? std::exp(w[p] - m) / z : 0.0;
          mass[p] += a;
          for (uint32_t i = 0; i < s.head_dim && a > 0; ++i) {
            out[(size_t{t} * s.q_heads + h) * s.head_dim + i] +=
                a * v_rows[p][kvh * s.head_dim + i];
          }
        }
      }
    }
  }
};

std::vector<Isa> UsableIsas(uint32_t head_dim) {
  std::vector<Isa> out{Isa::kPortable};
  if (IsaUsable(Isa::kAvx2Fma, head_dim)) out.push_back(Isa::kAvx2Fma);
  return out;
}

// Tolerances: f32 accumulation over <= 200 positions of unit-normal data; expf error ~2 ulp.
constexpr double kOutTol = 2e-5;
constexpr double kMassTol = 2e-5;

// Every usable ISA's output and position mass against Case::Reference.
void ExpectMatchesReference(const Case& c) {
  const Shape& s = c.s;
  std::vector<double> ref_out, ref_mass;
  c.Reference(ref_out, ref_mass);
  for (Isa isa : UsableIsas(s.head_dim)) {
    std::vector<float> out(ref_out.size(), NAN), mass(s.length, NAN), scratch;
    Attention(c.Params(out.data(), mass.data(), scratch), isa);
    SCOPED_TRACE(testing::Message()
                 << "shape q" << s.q_heads << " kv" << s.kv_heads << " d" << s.head_dim << " L"
                 << s.length << " n" << s.n << " isa " << static_cast<int>(isa));
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref_out[i], kOutTol) << i;
    for (size_t i = 0; i < mass.size(); ++i) ASSERT_NEAR(mass[i], ref_mass[i], kMassTol) << i;
  }
}

TEST(AttentionCpuTest, MatchesDoubleReferenceOverShapeGrid) {
  const Shape shapes[] = {
      {1, 1, 8, 1, 1},    {1, 1, 8, 9, 1},    {4, 2, 16, 33, 1}, {4, 2, 16, 33, 33},
      {9, 3, 64, 100, 1}, {9, 3, 64, 70, 5},  {8, 1, 24, 17, 4}, {6, 3, 12, 40, 2},
      {9, 3, 64, 200, 1}, {2, 2, 40, 64, 64}, {3, 1, 7, 11, 3},
  };
  uint32_t seed = 0;
  for (const Shape& s : shapes) {
    for (double evict : {0.0, 0.3}) {
      for (double mask : {0.0, 0.25}) {
        SCOPED_TRACE(testing::Message() << "evict " << evict << " mask " << mask);
        ExpectMatchesReference(Case(s, ++seed, evict, mask));
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(AttentionCpuTest, SlidingWindowAndSoftcapMatchDoubleReference) {
  // Windows shorter than, across and longer than a span (kSpan) and the cache, each with and
  // without a softcap (1.0 caps hard: scores of unit-normal data reach several units), with
  // evictions; decode (n 1), prefill (n = length) and a chunk in between.
  const Shape shapes[] = {{4, 2, 16, 33, 33},
                          {9, 3, 64, 300, 1},
                          {9, 3, 64, 200, 24},
                          {2, 2, 40, 64, 64},
                          {8, 1, 24, 700, 1}};
  uint32_t seed = 1000;
  for (const Shape& s : shapes) {
    for (uint32_t window : {0u, 1u, 5u, 16u, 100u, 1000u}) {
      for (float softcap : {0.f, 1.f, 50.f}) {
        if (window == 0 && softcap == 0.f) continue;
        Case c(s, ++seed, 0.2, 0.0);
        c.window = window;
        c.softcap = softcap;
        SCOPED_TRACE(testing::Message() << "window " << window << " softcap " << softcap);
        ExpectMatchesReference(c);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(AttentionCpuTest, WindowLeavesNoMassBehindIt) {
  Case c({4, 2, 16, 90, 1}, 7, 0.0, 0.0);
  c.window = 10;
  std::vector<float> out(4 * 16), mass(90), scratch;
  Attention(c.Params(out.data(), mass.data(), scratch));
  for (uint32_t p = 0; p < 80; ++p) EXPECT_EQ(mass[p], 0.f) << p;
  double total = 0;
  for (uint32_t p = 80; p < 90; ++p) total += mass[p];
  EXPECT_NEAR(total, 4.0, 1e-5);
}

TEST(AttentionCpuTest, MassSumsToQueriesTimesHeadsAndIsZeroWhereDead) {
  Case c({9, 3, 64, 120, 4}, 99, 0.2, 0.1);
  std::vector<float> out(4 * 9 * 64), mass(120), scratch;
  Attention(c.Params(out.data(), mass.data(), scratch));
  double total = 0;
  for (uint32_t p = 0; p < 120; ++p) {
    total += mass[p];
    if (c.k_rows[p] == nullptr) {
      EXPECT_EQ(mass[p], 0.f) << p;
    }
  }
  EXPECT_NEAR(total, 4.0 * 9, 1e-4);
}

TEST(AttentionCpuTest, ResultDependsOnlyOnValuesNotOnRowAddresses) {
  // Same values, rows scattered over differently aligned buffers: bit-identical results.
  for (Isa isa : UsableIsas(64)) {
    Case c({9, 3, 64, 77, 3}, 5, 0.1, 0.0);
    std::vector<float> out1(3 * 9 * 64), mass1(77), out2(out1.size()), mass2(77), scratch;
    Attention(c.Params(out1.data(), mass1.data(), scratch), isa);
    const size_t row = 3 * 64;
    std::vector<std::vector<float>> copies;
    for (uint32_t p = 0; p < 77; ++p) {
      if (c.k_rows[p] == nullptr) continue;
      copies.emplace_back(2 * row + 1 + p % 7);
      float* dst = copies.back().data() + 1 + p % 7;  // odd offsets: misaligned
      std::memcpy(dst, c.k_rows[p], row * 4);
      std::memcpy(dst + row, c.v_rows[p], row * 4);
      c.k_rows[p] = dst;
      c.v_rows[p] = dst + row;
    }
    Attention(c.Params(out2.data(), mass2.data(), scratch), isa);
    EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * 4), 0);
    EXPECT_EQ(std::memcmp(mass1.data(), mass2.data(), mass1.size() * 4), 0);
  }
}

TEST(AttentionCpuTest, AllDeadGivesZeroOutput) {
  Case c({4, 2, 16, 10, 1}, 3, 1.0, 0.0);
  std::vector<float> out(4 * 16, NAN), mass(10, NAN), scratch;
  Attention(c.Params(out.data(), mass.data(), scratch));
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : mass) EXPECT_EQ(x, 0.f);
}

TEST(AttentionCpuTest, NullMassLeavesOutputUnchanged) {
  Case c({9, 3, 64, 50, 2}, 8, 0.0, 0.0);
  std::vector<float> out1(2 * 9 * 64), out2(out1.size()), mass(50), scratch;
  Attention(c.Params(out1.data(), mass.data(), scratch));
  Attention(c.Params(out2.data(), nullptr, scratch));
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * 4), 0);
}

// Runs tasks on `threads` std::threads (the caller among them) claiming indices from a counter.
class ThreadRunner final : public TaskRunner {
 public:
  explicit ThreadRunner(int threads) : threads_(threads) {}
  int concurrency() const override { return threads_; }
  void Run(uint32_t n, const std::function<void(uint32_t)>& task) override {
    std::atomic<uint32_t> next{0};
    auto work = [&] {
      for (uint32_t i; (i = next.fetch_add(1)) < n;) task(i);
    };
    std::vector<std::thread> others;
    for (int t = 1; t < threads_; ++t) others.emplace_back(work);
    work();
    for (auto& t : others) t.join();
    ++runs;
  }
  int runs = 0;

 private:
  int threads_;
};

// Claims concurrency() but runs tasks on the caller in reverse order: a split whose result
// depended on task order or on which tasks share a thread would show here.
class ReverseRunner final : public TaskRunner {
 public:
  explicit ReverseRunner(int threads) : threads_(threads) {}
  int concurrency() const override { return threads_; }
  void Run(uint32_t n, const std::function<void(uint32_t)>& task) override {
    for (uint32_t i = n; i-- > 0;) task(i);
  }

 private:
  int threads_;
};

struct Result {
  std::vector<float> out, mass;
};

Result RunWith(const Case& c, Isa isa, TaskRunner* runner) {
  Result r{std::vector<float>(size_t{c.s.n} * c.s.q_heads * c.s.head_dim, NAN),
           std::vector<float>(c.s.length, NAN)};
  std::vector<float> scratch;
  AttentionParams p = c.Params(r.out.data(), r.mass.data(), scratch);
  p.runner = runner;
  Attention(p, isa);
  return r;
}

void ExpectBitIdentical(const Result& a, const Result& b) {
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.mass.data(), b.mass.data(), a.mass.size() * 4), 0);
}

TEST(AttentionCpuTest, SplitDecodeIsBitIdenticalToOneThread) {
  const Shape shapes[] = {{9, 3, 64, 512, 1},
                          {9, 3, 64, 2051, 1},
                          {8, 1, 24, 700, 1},
                          {12, 2, 32, 1030, 1},
                          {3, 1, 7, 600, 1}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    for (double evict : {0.0, 0.3}) {
      for (double mask : {0.0, 0.2}) {
        Case c(s, ++seed, evict, mask);
        for (Isa isa : UsableIsas(s.head_dim)) {
          SCOPED_TRACE(testing::Message()
                       << "L" << s.length << " d" << s.head_dim << " evict " << evict << " mask "
                       << mask << " isa " << static_cast<int>(isa));
          const Result alone = RunWith(c, isa, nullptr);
          for (int threads : {2, 3, 5}) {
            ThreadRunner real(threads);
            ExpectBitIdentical(alone, RunWith(c, isa, &real));
            EXPECT_GT(real.runs, 0) << "the split path did not run";
            ReverseRunner reverse(threads);
            ExpectBitIdentical(alone, RunWith(c, isa, &reverse));
          }
        }
      }
    }
  }
}

// The queries laid out heads first, [q_heads][n][head_dim] with `pad` unused floats after each
// head's run (transformers' layout of one batch row, a view into a wider tensor), read through
// q_token_stride / q_head_stride: bit-identical to the dense queries, on every ISA, alone and
// split over threads, for decode and prefill, with a window and a softcap.
TEST(AttentionCpuTest, StridedQueriesAreBitIdenticalToDense) {
  const Shape shapes[] = {{9, 3, 64, 600, 1},
                          {9, 3, 64, 300, 20},
                          {8, 1, 24, 90, 5},
                          {12, 2, 32, 530, 1},
                          {3, 1, 7, 40, 3}};
  uint32_t seed = 300;
  for (const Shape& s : shapes) {
    for (uint32_t pad : {0u, 5u}) {
      Case c(s, ++seed, 0.2, 0.1);
      c.window = seed % 2 == 0 ? 33 : 0;
      c.softcap = seed % 3 == 0 ? 2.f : 0.f;
      const size_t head_run = size_t{s.n} * s.head_dim + pad;
      std::vector<float> heads_first(s.q_heads * head_run, NAN);
      for (uint32_t t = 0; t < s.n; ++t) {
        for (uint32_t h = 0; h < s.q_heads; ++h) {
          std::memcpy(heads_first.data() + h * head_run + size_t{t} * s.head_dim,
                      c.q.data() + (size_t{t} * s.q_heads + h) * s.head_dim, s.head_dim * 4);
        }
      }
      for (Isa isa : UsableIsas(s.head_dim)) {
        for (int threads : {1, 3}) {
          SCOPED_TRACE(testing::Message()
                       << "L" << s.length << " n" << s.n << " d" << s.head_dim << " pad " << pad
                       << " isa " << static_cast<int>(isa) << " threads " << threads);
          ThreadRunner runner(threads);
          TaskRunner* r = threads == 1 ? nullptr : &runner;
          const Result dense = RunWith(c, isa, r);
          Result strided{std::vector<float>(dense.out.size(), NAN),
                         std::vector<float>(s.length, NAN)};
          std::vector<float> scratch;
          AttentionParams p = c.Params(strided.out.data(), strided.mass.data(), scratch);
          p.q = heads_first.data();
          p.q_token_stride = s.head_dim;
          p.q_head_stride = head_run;
          p.runner = r;
          Attention(p, isa);
          ExpectBitIdentical(dense, strided);
        }
      }
    }
  }
}

TEST(AttentionCpuTest, PrefillDoesNotDependOnThreadCount) {
  // 70 queries = five blocks of 16: waves of 2 and 3 blocks, and one block at a time.
  Case c({9, 3, 64, 300, 70}, 7, 0.1, 0.1);
  for (Isa isa : UsableIsas(64)) {
    const Result alone = RunWith(c, isa, nullptr);
    for (int threads : {2, 3}) {
      ThreadRunner real(threads);
      ExpectBitIdentical(alone, RunWith(c, isa, &real));
      ReverseRunner reverse(threads);
      ExpectBitIdentical(alone, RunWith(c, isa, &reverse));
    }
  }
}

TEST(AttentionCpuTest, EachQueryOfAPrefillMatchesItsDecodeStep) {
  // Query t of a prefill over L positions sees positions [0, L - n + t]: the same output as a
  // decode step over that prefix, bit for bit (prefill and decode agree).
  Case c({9, 3, 64, 600, 40}, 11, 0.1, 0.0);
  for (Isa isa : UsableIsas(64)) {
    ThreadRunner runner(2);
    const Result all = RunWith(c, isa, &runner);
    for (uint32_t t : {0u, 17u, 39u}) {
      Case step = c;
      step.s.length = c.s.length - c.s.n + t + 1;
      step.s.n = 1;
      step.q.assign(c.q.begin() + size_t{t} * 9 * 64, c.q.begin() + size_t{t + 1} * 9 * 64);
      step.k_rows.resize(step.s.length);
      step.v_rows.resize(step.s.length);
      const Result one = RunWith(step, isa, &runner);
      EXPECT_EQ(std::memcmp(one.out.data(), all.out.data() + size_t{t} * 9 * 64, 9 * 64 * 4), 0)
          << t;
    }
  }
}

}  // namespace
}  // namespace kvtier::worker::kernels
