#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"

namespace kvtier::engine {

absl::StatusOr<Sampler> Sampler::Create(const SamplerOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampler temperature %f must be finite and >= 0", o.temperature));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat("sampler top_p %f not in (0, 1]", o.top_p));
  }
  return Sampler(o);
}

int32_t Sampler::Argmax(std::span<const float> logits) {
  int32_t best = 0;
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > logits[best]) best = static_cast<int32_t>(i);
    found = true;
  }
  return best;
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.temperature == 0.f) return Argmax(logits);
  const float mx = logits[Argmax(logits)];
  std::vector<std::pair<float, int32_t>> probs;
  probs.reserve(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    const float p = std::exp((logits[i] - mx) / options_.temperature);
    probs.emplace_back(p, static_cast<int32_t>(i));
    sum += p;
  }
  if (probs.empty()) return 0;
  std::sort(probs.begin(), probs.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  // Smallest prefix whose mass reaches top_p.
  size_t keep = probs.size();
  double cum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    cum += probs[i].first / sum;
    if (cum >= options_.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs[i].first;
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i].first;
    if (u < acc) return probs[i].second;
  }
  return probs[keep - 1].second;
}

}  // namespace kvtier::engine
