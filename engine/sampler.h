#ifndef KVTIER_ENGINE_SAMPLER_H_
#define KVTIER_ENGINE_SAMPLER_H_

// Next-token selection: greedy (temperature 0) or seeded temperature + nucleus (top-p)
// sampling. The same seed and logits always give the same tokens (own PRNG arithmetic, no
// std:: distributions, so results do not depend on the standard library).

#include <cstdint>
#include <random>
#include <span>

#include "absl/status/statusor.h"

namespace kvtier::engine {

struct SamplerOptions {
  float temperature = 0.f;  // 0 = greedy
  float top_p = 1.f;        // (0, 1]
  uint64_t seed = 0;
};

// Not thread-safe (owns a PRNG): one per sequence.
class Sampler {
 public:
  // INVALID_ARGUMENT for a negative/non-finite temperature or top_p outside (0, 1].
  static absl::StatusOr<Sampler> Create(const SamplerOptions& options);

  // REQUIRES: logits non-empty. NaN logits are never chosen (unless all are NaN: id 0).
  int32_t Sample(std::span<const float> logits);

  // Index of the largest logit, lowest index on ties.
  static int32_t Argmax(std::span<const float> logits);

 private:
  explicit Sampler(const SamplerOptions& o) : options_(o), rng_(o.seed) {}
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_SAMPLER_H_
