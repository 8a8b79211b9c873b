#include "worker/engine/matmul.h"

#include <algorithm>

namespace kvtier::engine {
namespace {
constexpr size_t kTokenTile = 16;  // activations of a tile stay in L1/L2 while rows stream
constexpr size_t kRowGrain = 16;
}  // namespace

void MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* y, ThreadPool& pool,
            KernelIsa isa) {
  const VecDotFn dot = GetVecDot(w.type, isa);
  const VecDot4Fn dot4 = GetVecDot4(w.type, isa);
  pool.ParallelFor(
      w.rows,
      [&](size_t begin, size_t end) {
        for (size_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
          const size_t t1 = std::min(n_tokens, t0 + kTokenTile);
          for (size_t r = begin; r < end; ++r) {
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
        }
      },
      kRowGrain);
}

}  // namespace kvtier::engine
