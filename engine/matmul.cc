#include "engine/matmul.h"

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

// Rows [begin, end) of one output, token tile by token tile.
void MatMulRows(const WeightMatrix& w, const float* x, const float* sums, size_t n_tokens, float* y,
                size_t begin, size_t end, KernelIsa isa) {
  const VecDotFn dot = GetVecDot(w.type, isa);
  const VecDot4Fn dot4 = GetVecDot4(w.type, isa);
  const VecDotSumsFn dot_sums = GetVecDotSums(w.type, isa);
  const VecDot4SumsFn dot4_sums = GetVecDot4Sums(w.type, isa);
  for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
    const size_t t1 = std::min(n_tokens, t0 + kTokenTile);
    for (size_t r = begin; r < end; ++r) {
      if (dot_sums != nullptr) {
        RowSums(w, r, x, sums, t0, t1, y, dot_sums, dot4_sums);
      } else {
        RowPlain(w, r, x, t0, t1, y, dot, dot4);
      }
    }
  }
}

}  // namespace

void MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* y, ThreadPool& pool,
            KernelIsa isa) {
  const MatMulOutput out{&w, y};
  MatMulShared(std::span<const MatMulOutput>(&out, 1), x, n_tokens, pool, isa);
}

void MatMulShared(std::span<const MatMulOutput> outputs, const float* x, size_t n_tokens,
                  ThreadPool& pool, KernelIsa isa) {
  if (outputs.empty()) return;
  const size_t cols = outputs[0].w->cols;
  bool any_sums = false;
  size_t rows = 0;
  for (const MatMulOutput& o : outputs) {
    any_sums |= GetVecDotSums(o.w->type, isa) != nullptr;
    rows += o.w->rows;
  }
  std::vector<float> sums;
  if (any_sums) {
    const size_t nb = cols / 32;
    sums.resize(n_tokens * nb);
    for (size_t t = 0; t < n_tokens; ++t) BlockSums(x + t * cols, cols, &sums[t * nb]);
  }
  // Rows are numbered across the outputs in order; a range may span several of them.
  pool.ParallelFor(
      rows,
      [&](size_t begin, size_t end) {
        size_t first = 0;
        for (const MatMulOutput& o : outputs) {
          const size_t b = std::max(begin, first), e = std::min(end, first + o.w->rows);
          if (b < e) MatMulRows(*o.w, x, sums.data(), n_tokens, o.y, b - first, e - first, isa);
          first += o.w->rows;
        }
      },
      kRowGrain);
}

}  // namespace kvtier::engine
