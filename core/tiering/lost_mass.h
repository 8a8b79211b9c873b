#ifndef KVTIER_CORE_TIERING_LOST_MASS_H_
#define KVTIER_CORE_TIERING_LOST_MASS_H_

// The quality guardrail: the share of a decode step's attention mass that a sequence cannot
// serve exactly. Two parts, both per decode step and in the units of the cumulative score (the
// layer-mean of the head-mean softmax, which sums to 1 over a group's positions):
//   compressed  mass the T2 pages drew, each weighted by its measured codec error (the relative
//               L2 error of its dequantized K and V): observed, since T2 pages are attended;
//   evicted     an estimate of the mass the T3 pages would draw: they are never attended again,
//               so it comes from what each page drew while it lived (PageMassEstimate).
// Pure functions; thread-safe.

#include <cstdint>

#include "absl/types/span.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

struct LostMass {
  double compressed = 0;
  double evicted = 0;
  double total() const { return compressed + evicted; }
};

// Queries that attended page `page` by the time the sequence has `length` positions: every
// prefill row and decode step at or after the page's middle position (causal attention).
// At least 1. REQUIRES: page_tokens > 0.
double PageQueries(uint32_t page, uint32_t page_tokens, uint64_t length);

// The per-step mass a page draws, estimated from its cumulative score (sum over its tokens):
// its mean over the queries that saw it, score / PageQueries. Stateless, so the daemon, the
// worker and a policy compute it from a snapshot alone. For an evicted page the score is frozen
// and the divisor keeps growing: the estimate decays like 1 / age, as attention to old tokens
// does. Under PageScoreMode::kMax the score is one token's, and the estimate is a lower bound.
double PageMassEstimate(float score, uint32_t page, uint32_t page_tokens, uint64_t length);

// Σ PageMassEstimate over the T3 pages of one group. `page_scores` and `tiers` are that group's
// (tiers may be shorter: pages past it are live).
double EvictedMassEstimate(absl::Span<const float> page_scores, absl::Span<const Tier> tiers,
                           uint32_t page_tokens, uint64_t length);

// Σ over the T2 pages of one group of (score gained over `steps` decode steps / steps) × the
// page's measured error. Pages past the shorter of the spans count 0; steps = 0 gives 0.
double CompressedLostMass(absl::Span<const float> gained_page_scores, absl::Span<const Tier> tiers,
                          absl::Span<const float> page_errors, uint64_t steps);

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_LOST_MASS_H_
