#ifndef KVTIER_TESTS_SUPPORT_SYNTHETIC_ENGINE_H_
#define KVTIER_TESTS_SUPPORT_SYNTHETIC_ENGINE_H_

// A model-free engine for tests: K, V and Q of every (layer, position) are a pure function of
// (seed, layer, position), so two caches fed by the same engine see the same numbers and any
// difference in their outputs comes from the caches. Thread-compatible.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/attention_cache.h"

namespace kvtier::testing {

class SyntheticEngine {
 public:
  SyntheticEngine(worker::AttentionShape shape, uint64_t seed) : shape_(shape), seed_(seed) {}

  // One forward pass of `n` new tokens through every layer of `cache`; appends each layer's
  // attention output ([n][q_heads][head_dim]) to `outputs` when not null.
  absl::Status Forward(worker::AttentionCache& cache, uint32_t n, std::vector<float>* outputs);

  const worker::AttentionShape& shape() const { return shape_; }

 private:
  // Values in [-1, 1), a few positions "loud" so attention is far from uniform.
  void Fill(uint32_t layer, uint64_t position, uint32_t which, uint32_t count, float* out) const;
  worker::AttentionShape shape_;
  uint64_t seed_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_SYNTHETIC_ENGINE_H_
