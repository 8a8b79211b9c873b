#include "core/tiering/lost_mass.h"

#include <algorithm>

namespace kvtier::tiering {

double PageQueries(uint32_t page, uint32_t page_tokens, uint64_t length) {
  const double middle = static_cast<double>(page) * page_tokens + (page_tokens - 1) / 2.0;
  return std::max(1.0, static_cast<double>(length) - middle);
}

double PageMassEstimate(float score, uint32_t page, uint32_t page_tokens, uint64_t length) {
  return std::max(0.0, double{score}) / PageQueries(page, page_tokens, length);
}

double EvictedMassEstimate(absl::Span<const float> page_scores, absl::Span<const Tier> tiers,
                           uint32_t page_tokens, uint64_t length) {
  double mass = 0;
  const size_t n = std::min(page_scores.size(), tiers.size());
  for (size_t p = 0; p < n; ++p) {
    if (tiers[p] != Tier::kT3) continue;
    mass += PageMassEstimate(page_scores[p], static_cast<uint32_t>(p), page_tokens, length);
  }
  return mass;
}

double CompressedLostMass(absl::Span<const float> gained_page_scores, absl::Span<const Tier> tiers,
                          absl::Span<const float> page_errors, uint64_t steps) {
  if (steps == 0) return 0;
  double mass = 0;
  const size_t n = std::min({gained_page_scores.size(), tiers.size(), page_errors.size()});
  for (size_t p = 0; p < n; ++p) {
    if (tiers[p] != Tier::kT2) continue;
    mass += std::max(0.0f, gained_page_scores[p]) * double{page_errors[p]};
  }
  return mass / static_cast<double>(steps);
}

}  // namespace kvtier::tiering
