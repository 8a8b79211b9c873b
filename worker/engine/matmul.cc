#include "worker/engine/matmul.h"

#include <algorithm>
#include <vector>

namespace kvtier::engine {
namespace {
constexpr size_t kTokenTile = 16;  // activations of a tile stay in L1/L2 while rows stream
constexpr size_t kRowGrain = 16;

// One (row, token-range) step with the plain kernels.
void RowPlain(const WeightMatrix& w, size_t r, const float* x, size_t t0, size_t t1, float* y,
              VecDotFn dot, VecDot4Fn dot4) {
  const uint8_t* row = w.Row(r);
  size_t t = t0;
  if (dot4 != nullptr) {
    float out[4];
    for (; t + 4 <= t1; t += 4) {
      dot4(row, x + t * w.cols, w.cols, w.cols, out);
      for (int j = 0; j < 4; ++j) y[(t + j) * w.rows + r] = out[j];
    }
  }
  for (; t < t1; ++t) y[t * w.rows + r] = dot(row, x + t * w.cols, w.cols);
}

// The same with kernels that take precomputed block sums ([token][cols / 32]).
void RowSums(const WeightMatrix& w, size_t r, const float* x, const float* sums, size_t t0,
             size_t t1, float* y, VecDotSumsFn dot, VecDot4SumsFn dot4) {
  const uint8_t* row = w.Row(r);
  const size_t nb = w.cols / 32;
  size_t t = t0;
  if (dot4 != nullptr) {
    float out[4];
    for (; t + 4 <= t1; t += 4) {
      dot4(row, x + t * w.cols, sums + t * nb, w.cols, w.cols, out);
      for (int j = 0; j < 4; ++j) y[(t + j) * w.rows + r] = out[j];
    }
  }
  for (; t < t1; ++t) y[t * w.rows + r] = dot(row, x + t * w.cols, sums + t * nb, w.cols);
}

}  // namespace

void MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* y, ThreadPool& pool,
            KernelIsa isa) {
  const VecDotFn dot = GetVecDot(w.type, isa);
  const VecDot4Fn dot4 = GetVecDot4(w.type, isa);
  const VecDotSumsFn dot_sums = GetVecDotSums(w.type, isa);
  const VecDot4SumsFn dot4_sums = GetVecDot4Sums(w.type, isa);
  std::vector<float> sums;
  if (dot_sums != nullptr) {
    const size_t nb = w.cols / 32;
    sums.resize(n_tokens * nb);
    for (size_t t = 0; t < n_tokens; ++t) BlockSums(x + t * w.cols, w.cols, &sums[t * nb]);
  }
  pool.ParallelFor(
      w.rows,
      [&](size_t begin, size_t end) {
        for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
          const size_t t1 = std::min(n_tokens, t0 + kTokenTile);
          for (size_t r = begin; r < end; ++r) {
            if (dot_sums != nullptr) {
              RowSums(w, r, x, sums.data(), t0, t1, y, dot_sums, dot4_sums);
            } else {
              RowPlain(w, r, x, t0, t1, y, dot, dot4);
            }
          }
        }
      },
      kRowGrain);
}

}  // namespace kvtier::engine
