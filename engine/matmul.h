#ifndef KVTIER_ENGINE_MATMUL_H_
#define KVTIER_ENGINE_MATMUL_H_

// Quantized weight matrix times f32 activations, rows split across a ThreadPool. Weights are
// read in place (from the GGUF mapping): nothing is dequantized to memory.

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/gguf.h"
#include "engine/quant.h"
#include "engine/thread_pool.h"

namespace kvtier::engine {

// A row-major matrix of `rows` rows of `cols` elements, each row `row_bytes` bytes of `type`
// (a GGUF tensor [ne0 = cols, ne1 = rows]).
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  size_t row_bytes = 0;

  const uint8_t* Row(size_t r) const { return data + r * row_bytes; }
};

// y[t][r] = Σ_c W[r][c] · x[t][c] for t < n_tokens.  x: [n_tokens][cols], y: [n_tokens][rows].
// Each output is one fused dot product, so a token's result does not depend on n_tokens or on
// the thread count (prefill and decode agree bit for bit).
void MatMul(const WeightMatrix& w, const float* x, size_t n_tokens, float* y, ThreadPool& pool,
            KernelIsa isa);

// One output of MatMuls that share their activations: y = w · x as MatMul writes it.
struct MatMulOutput {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
};

// MatMul for every output (all with x's cols) in one fork-join over all their rows, with the
// activations' block sums computed once: a decode step forks once for Q, K and V and once for
// gate and up instead of once per matrix. Every output element is computed as MatMul computes
// it, so the results are the same bit for bit.
void MatMulShared(std::span<const MatMulOutput> outputs, const float* x, size_t n_tokens,
                  ThreadPool& pool, KernelIsa isa);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_MATMUL_H_
