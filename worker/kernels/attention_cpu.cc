#include "worker/kernels/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define KVTIER_HAVE_X86 1
#endif

namespace kvtier::worker::kernels {
namespace {

inline size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

// A row of zeros standing in for dead rows inside a block of four.
const float* ZeroRow(uint32_t head_dim) {
  thread_local std::vector<float> zeros;
  if (zeros.size() < head_dim) zeros.assign(head_dim, 0.f);
  return zeros.data();
}

// Fetches the line at c into L2 (and L1). On x86 an asm statement: GCC 12 deleted loops of
// __builtin_prefetch here as dead code (objdump showed no prefetch in the score pass).
inline void PrefetchLine(const char* c) {
#if KVTIER_HAVE_X86
  asm volatile("prefetcht1 %0" : : "m"(*c));
#else
  __builtin_prefetch(c, 0, 2);
#endif
}

inline void PrefetchRow(const float* row, size_t bytes) {
  if (row == nullptr) return;
  const char* c = reinterpret_cast<const char*>(row);
  for (size_t off = 0; off < bytes; off += 64) PrefetchLine(c + off);
}

// Rows ahead of the one being read that are prefetched, counted in the order a task reads them.
// Pages are short contiguous runs, too short for the hardware prefetcher to ramp up on.
constexpr uint32_t kPrefetchAhead = 32;

// Positions per span (the skeleton's AttendSpan). A power of two: the prefetcher's reading-order
// arithmetic below, run for every row, is then shifts and masks (with a run-time span it was
// 64-bit divisions, 22 of them in the decode loops).
constexpr uint32_t kSpan = 256;
static_assert((kSpan & (kSpan - 1)) == 0);

// Prefetches the rows a task over positions [b, e) reads, in its reading order: per span of
// kSpan positions from b, its K rows, then its V rows.
class RowPrefetcher {
 public:
  RowPrefetcher(const float* const* k_rows, const float* const* v_rows, size_t row_bytes,
                uint32_t b, uint32_t e)
      : k_(k_rows), v_(v_rows), bytes_(row_bytes), b_(b), e_(e) {}
  // The K (V) row of position pos is being read.
  void K(uint32_t pos) { Until(Slot(pos, false) + kPrefetchAhead); }
  void V(uint32_t pos) { Until(Slot(pos, true) + kPrefetchAhead); }

 private:
  // Reading-order index of pos's K or V row; a short last span leaves unused indices.
  uint64_t Slot(uint32_t pos, bool v) const {
    const uint32_t sb = pos - (pos - b_) % kSpan;
    const uint32_t n = std::min(kSpan, e_ - sb);
    return uint64_t{(sb - b_) / kSpan} * 2 * kSpan + (v ? n : 0) + (pos - sb);
  }
  void Until(uint64_t slot) {
    for (; next_ < slot; ++next_) {
      const uint32_t sb = b_ + static_cast<uint32_t>(next_ / (2 * kSpan)) * kSpan;
      if (sb >= e_) return;
      const uint32_t off = static_cast<uint32_t>(next_ % (2 * kSpan));
      const uint32_t n = std::min(kSpan, e_ - sb);
      if (off < n)
        PrefetchRow(k_[sb + off], bytes_);
      else if (off < 2 * n)
        PrefetchRow(v_[sb + off - n], bytes_);
    }
  }
  const float* const* k_;
  const float* const* v_;
  size_t bytes_;
  uint32_t b_, e_;
  uint64_t next_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Portable: plain scalar loops, sequential sums.
namespace portable {
namespace {

float Dot(const float* a, const float* b, uint32_t n) {
  float acc = 0.f;
  for (uint32_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}
void ScoreRows(const float* q, const float* const* rows, uint32_t hd, float* dots) {
  for (int j = 0; j < 4; ++j) dots[j] = Dot(q, rows[j], hd);
}
void ScoreGroup(const float* q, size_t q_stride, uint32_t heads, const float* const* rows,
                uint32_t hd, float* dots) {
  for (uint32_t g = 0; g < heads; ++g) ScoreRows(q + g * q_stride, rows, hd, dots + 4 * g);
}
void Scale4(const float* src, float f, float* dst) {
  for (int j = 0; j < 4; ++j) dst[j] = src[j] * f;
}
float MaxOf(const float* s, uint32_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (uint32_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  return m;
}
float ExpSumInPlace(float* s, uint32_t n, float max) {
  float z = 0.f;
  for (uint32_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - max);
    z += s[i];
  }
  return z;
}
void ScaleInPlace(float* s, uint32_t n, float f) {
  for (uint32_t i = 0; i < n; ++i) s[i] *= f;
}
void AddTo(float* dst, const float* src, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) dst[i] += src[i];
}
void AccumulateValues(const AttentionParams& p, const float* w, size_t stride, uint32_t b,
                      uint32_t e, float* out, RowPrefetcher&) {
  const uint32_t group = p.num_q_heads / p.num_kv_heads;
  const uint32_t hd = p.head_dim;
  std::fill(out, out + size_t{p.num_q_heads} * hd, 0.f);
  for (uint32_t pos = b; pos < e; ++pos) {
    const float* row = p.v_rows[pos];
    if (row == nullptr) continue;
    for (uint32_t kvh = 0; kvh < p.num_kv_heads; ++kvh) {
      if (p.keep != nullptr && p.keep[kvh][pos] == 0) continue;
      const float* v = row + size_t{kvh} * hd;
      for (uint32_t g = 0; g < group; ++g) {
        const uint32_t h = kvh * group + g;
        const float wh = w[h * stride + pos];
        float* o = out + size_t{h} * hd;
        for (uint32_t d = 0; d < hd; ++d) o[d] += wh * v[d];
      }
    }
  }
}

#include "worker/kernels/attention_cpu_skeleton.inc"

}  // namespace
}  // namespace portable

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA. head_dim % 8 == 0.
#if KVTIER_HAVE_X86
// clang ignores GCC's target pragma (the fuzz build compiles this file with clang).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
namespace {

inline float HSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}
inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Dots of q with four rows: one FMA chain per row over the 8-wide chunks of head_dim, then one
// shared horizontal reduction whose tree is the same for every slot.
void ScoreRows(const float* q, const float* const* rows, uint32_t hd, float* dots) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (uint32_t d = 0; d < hd; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[0] + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[1] + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[2] + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[3] + d), a3);
  }
  const __m256 t01 = _mm256_hadd_ps(a0, a1);
  const __m256 t23 = _mm256_hadd_ps(a2, a3);
  const __m256 t = _mm256_hadd_ps(t01, t23);  // [r0 r1 r2 r3 | r0' r1' r2' r3']
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  _mm_storeu_ps(dots, r);
}

// ScoreRows for G query heads (q + g * q_stride) at once: each K chunk is loaded once for all G.
// Every dot keeps ScoreRows' FMA chain and reduction tree, so the scores are the same bit for bit.
// The loops over heads and rows are unrolled so that the accumulators live in registers (GCC
// kept them on the stack otherwise: a store and a reload around every FMA).
template <int G>
inline void ScoreRowsG(const float* q, size_t q_stride, const float* const* rows, uint32_t hd,
                       float* dots) {
  __m256 acc[G][4];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
  }
  for (uint32_t d = 0; d < hd; d += 8) {
    __m256 qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm256_loadu_ps(q + g * q_stride + d);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256 k = _mm256_loadu_ps(rows[j] + d);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g][j] = _mm256_fmadd_ps(qv[g], k, acc[g][j]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m256 t01 = _mm256_hadd_ps(acc[g][0], acc[g][1]);
    const __m256 t23 = _mm256_hadd_ps(acc[g][2], acc[g][3]);
    const __m256 t = _mm256_hadd_ps(t01, t23);
    _mm_storeu_ps(dots + 4 * g, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
}

inline void Scale4(const float* src, float f, float* dst) {
  _mm_storeu_ps(dst, _mm_mul_ps(_mm_loadu_ps(src), _mm_set1_ps(f)));
}

// dots[4 * g + j] = q_g . rows[j] for the `heads` query heads at q (q + g * q_stride).
void ScoreGroup(const float* q, size_t q_stride, uint32_t heads, const float* const* rows,
                uint32_t hd, float* dots) {
  uint32_t g = 0;
  for (; g + 3 <= heads; g += 3) ScoreRowsG<3>(q + g * q_stride, q_stride, rows, hd, dots + 4 * g);
  for (; g + 2 <= heads; g += 2) ScoreRowsG<2>(q + g * q_stride, q_stride, rows, hd, dots + 4 * g);
  for (; g < heads; ++g) ScoreRows(q + g * q_stride, rows, hd, dots + 4 * g);
}

float MaxOf(const float* s, uint32_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (uint32_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
  return HMax(m);
}

// Cephes-style expf, |rel err| < 2 ulp on [-87, 0]; exactly 0 below -87 (and for -inf).
inline __m256 Exp(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_and_ps(y, live);
}

float ExpSumInPlace(float* s, uint32_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 z = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    z = _mm256_add_ps(z, e);
  }
  return HSum(z);
}

void ScaleInPlace(float* s, uint32_t n, float f) {
  const __m256 vf = _mm256_set1_ps(f);
  for (uint32_t i = 0; i < n; i += 8) {
    _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), vf));
  }
}

void AddTo(float* dst, const float* src, uint32_t n) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  }
  for (; i < n; ++i) dst[i] += src[i];
}

// Positions per block of the value pass: a block's V rows stay in L1 while every query head of
// the group sweeps it, next to the rows prefetched ahead (16 rows, 12 KiB for SmolLM, measured
// faster than 32 here). Blocking does not change any sum's order (each output element still
// accumulates position by position).
constexpr uint32_t kValueBlock = 16;

// For the G query heads of kv head `kvh` (weights w + g * stride, outputs o + g * hd), adds
// sum over positions [b, e) of w_g[pos] * v_rows[pos][off .. off + 8 * NV). Each V chunk is
// loaded once for all G heads. Every output element still accumulates position by position
// with one FMA each, so the grouping does not change any result.
template <int G, int NV>
__attribute__((noinline)) void AccumulateHeads(const AttentionParams& p, const float* w,
                                               size_t stride, uint32_t kvh, size_t off, uint32_t b,
                                               uint32_t e, float* o) {
  const uint32_t hd = p.head_dim;
  const float* const* v_rows = p.v_rows;
  const uint8_t* keep = p.keep != nullptr ? p.keep[kvh] : nullptr;
  __m256 acc[G * NV];
#pragma GCC unroll 16
  for (int i = 0; i < G * NV; ++i) acc[i] = _mm256_loadu_ps(o + i / NV * hd + 8 * (i % NV));
  for (uint32_t pos = b; pos < e; ++pos) {
    const float* row = v_rows[pos];
    const bool live = row != nullptr && (keep == nullptr || keep[pos] != 0);
    if (live) {
      __m256 v[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) v[j] = _mm256_loadu_ps(row + off + 8 * j);
#pragma GCC unroll 16
      for (int i = 0; i < G * NV; ++i) {
        acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i / NV * stride + pos), v[i % NV], acc[i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < G * NV; ++i) _mm256_storeu_ps(o + i / NV * hd + 8 * (i % NV), acc[i]);
}

// A value unit: query heads [g0, g0 + G) of kv head kvh (G <= 4 held in registers) over dims
// [d, d + 8 * nv). Units tile the output; the serial pass and every split visit the same units,
// and a unit's arithmetic does not depend on which others share its task.
struct ValueUnit {
  uint32_t kvh, g0, G, d, nv;
};

// 8-lane vectors of head_dim per unit for G query heads: G * nv accumulators + nv rows + a
// broadcast weight fit in 16 ymm, and G * nv >= 8 independent FMA chains keep both FMA pipes
// busy (each chain waits 4 cycles per position).
constexpr uint32_t ValueChunk(uint32_t G) { return G <= 2 ? 4 : G == 3 ? 3 : 2; }

// Calls fn(unit) for units in order: kv heads, then groups of <= 4 query heads, then dims in
// chunks of 8 * ValueChunk(G), one 16-wide and 8-wide remainders. The grouping of dims into
// units changes no result: each output element accumulates position by position on its own.
template <typename Fn>
inline void ForEachValueUnit(const AttentionParams& p, Fn&& fn) {
  const uint32_t group = p.num_q_heads / p.num_kv_heads;
  const uint32_t hd = p.head_dim;
  for (uint32_t kvh = 0; kvh < p.num_kv_heads; ++kvh) {
    for (uint32_t g0 = 0; g0 < group; g0 += 4) {
      const uint32_t G = std::min<uint32_t>(4, group - g0);
      const uint32_t nv = ValueChunk(G);
      uint32_t d = 0;
      for (; d + 8 * nv <= hd; d += 8 * nv) fn(ValueUnit{kvh, g0, G, d, nv});
      if (nv > 2 && d + 16 <= hd) {
        fn(ValueUnit{kvh, g0, G, d, 2});
        d += 16;
      }
      for (; d < hd; d += 8) fn(ValueUnit{kvh, g0, G, d, 1});
    }
  }
}

template <int G>
inline void AccumulateUnitG(const AttentionParams& p, const float* w, size_t stride,
                            const ValueUnit& u, uint32_t b, uint32_t e, float* o) {
  const size_t off = size_t{u.kvh} * p.head_dim + u.d;
  constexpr int kNv = ValueChunk(G);
  if (u.nv == kNv) return AccumulateHeads<G, kNv>(p, w, stride, u.kvh, off, b, e, o);
  if constexpr (kNv > 2) {
    if (u.nv == 2) return AccumulateHeads<G, 2>(p, w, stride, u.kvh, off, b, e, o);
  }
  AccumulateHeads<G, 1>(p, w, stride, u.kvh, off, b, e, o);
}

void AccumulateUnit(const AttentionParams& p, const float* w, size_t stride, const ValueUnit& u,
                    uint32_t b, uint32_t e, float* out) {
  const uint32_t group = p.num_q_heads / p.num_kv_heads;
  const uint32_t h = u.kvh * group + u.g0;
  const float* wh = w + h * stride;
  float* o = out + size_t{h} * p.head_dim + u.d;
  switch (u.G) {
    case 1:
      return AccumulateUnitG<1>(p, wh, stride, u, b, e, o);
    case 2:
      return AccumulateUnitG<2>(p, wh, stride, u, b, e, o);
    case 3:
      return AccumulateUnitG<3>(p, wh, stride, u, b, e, o);
    default:
      return AccumulateUnitG<4>(p, wh, stride, u, b, e, o);
  }
}

// out = sum over positions [b, e) of w[h][pos] * v[pos], position by position, in blocks of
// kValueBlock positions whose V rows stay in L1 while every unit sweeps them.
void AccumulateValues(const AttentionParams& p, const float* w, size_t stride, uint32_t b,
                      uint32_t e, float* out, RowPrefetcher& pf) {
  std::fill(out, out + size_t{p.num_q_heads} * p.head_dim, 0.f);
  uint32_t units = 0;
  ForEachValueUnit(p, [&](const ValueUnit&) { ++units; });
  for (uint32_t i = b; i < e; i += kValueBlock) {
    const uint32_t end = std::min(e, i + kValueBlock);
    // The block's prefetches are spread over its units: a burst of them at the block's start
    // fills the miss buffers and stalls the loads behind it.
    uint32_t k = 0;
    ForEachValueUnit(p, [&](const ValueUnit& u) {
      pf.V(i + (end - i) * ++k / units - 1);
      AccumulateUnit(p, w, stride, u, i, end, out);
    });
  }
}

#include "worker/kernels/attention_cpu_skeleton.inc"

}  // namespace
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // KVTIER_HAVE_X86

// ---------------------------------------------------------------------------------------------

size_t AttentionScratchFloats(uint32_t num_q_heads, uint32_t length) {
  return size_t{num_q_heads} * RoundUp8(length);
}

Isa BestIsa() {
#if KVTIER_HAVE_X86
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return Isa::kAvx2Fma;
#endif
  return Isa::kPortable;
}

bool IsaUsable(Isa isa, uint32_t head_dim) {
  if (isa == Isa::kPortable) return true;
  return BestIsa() == Isa::kAvx2Fma && head_dim % 8 == 0;
}

void Attention(const AttentionParams& p, Isa isa) {
#if KVTIER_HAVE_X86
  if (isa == Isa::kAvx2Fma) {
    avx2::RunAttention(p);
    return;
  }
#endif
  portable::RunAttention(p);
}

void Attention(const AttentionParams& p) {
  Attention(p, IsaUsable(BestIsa(), p.head_dim) ? BestIsa() : Isa::kPortable);
}

}  // namespace kvtier::worker::kernels
