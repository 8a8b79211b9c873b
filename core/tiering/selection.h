#ifndef KVTIER_CORE_TIERING_SELECTION_H_
#define KVTIER_CORE_TIERING_SELECTION_H_

// The O(n) tier selection for one layer group, shared by every page-level policy (hierarchy,
// streaming, full, arkv). Pure functions; thread-compatible.

#include <array>
#include <bit>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/config.h"
#include "core/tiering/types.h"

namespace kvtier::tiering {

// Half-open range [begin, end) of positions or pages.
struct Range {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The protected pages of one sequence: sorted, disjoint page ranges. A page is protected when it
// holds any protected position, and the last page is protected while it is partial (the worker
// is still appending to it), so every candidate page holds exactly page_tokens positions.
struct ProtectedPages {
  uint64_t num_pages = 0;
  uint64_t protected_tokens = 0;  // written positions inside protected pages
  std::vector<Range> ranges;      // page ranges, sorted and merged

  bool Contains(uint64_t page) const;
  uint64_t CandidatePages() const;
};

// Pages of a sequence of `length` positions protecting the given position ranges (clipped to
// [0, length)). REQUIRES: page_tokens > 0.
ProtectedPages MakeProtectedPages(uint64_t length, uint32_t page_tokens,
                                  absl::Span<const Range> positions);

// DESIGN.md §2's protected set: the prompt (if config.protect_prompt), the first sink_tokens
// generated positions and the last window_tokens positions.
ProtectedPages HierarchyProtectedPages(const TieringConfig& config, const SequenceState& seq);

// What one group's selection decided.
struct GroupStats {
  uint64_t candidate_pages = 0;   // pages with no protected position (eligible)
  uint64_t evicted_pages = 0;     // after this decision (monotone)
  uint64_t t0_budget_tokens = 0;  // ceil(β × live tokens)
  uint64_t protected_tokens = 0;
  uint64_t overflow_tokens = 0;             // protected tokens beyond the T0 budget (0 if none)
  std::array<uint64_t, kNumTiers> pages{};  // pages per tier after the decision
};

// Pages to evict in total for `candidate_pages` full candidate pages at ratio r:
// floor(floor(r × candidate_pages × page_tokens) / page_tokens).
uint64_t TargetEvictedPages(double evict_ratio, uint64_t candidate_pages, uint32_t page_tokens);

// How SelectGroup ranks: partial selection (the default, O(n)) or a full sort (O(n log n)),
// kept for the benchmark's comparison and as a cross-check in tests. Same result.
enum class SelectMethod : uint8_t { kNthElement = 0, kFullSort = 1 };

// Decides the tiers of one group's pages.
//   scores   one score per page (size protected.num_pages), higher = more important; finite.
//   current  the group's current tiers; may be shorter than num_pages (pages written since
//            are in T0); T3 pages must be candidates and at most the eviction target.
//   out      receives the target tiers (size num_pages).
// Candidates ranked by (score, page) descending fill T0, then T1, then T2; the bottom go to T3.
// Counts: T3 = TargetEvictedPages, cut short (lowest score first) where the evicted pages'
// PageMassEstimate sum would exceed budgets.max_lost_mass (ε = 0: no new eviction); T2 = floor(γ ×
// survivors); T0 = min(room left by protected tokens under ceil(β × live tokens), survivors − T2)
// (docs/tiering.md). REQUIRES: every ratio of `budgets` in [0, 1] (r + γ may exceed 1 here: ARKV
// passes γ = 1 − its OQ ratio). Already-evicted pages stay evicted and count towards the eviction
// target. `scratch` is reused storage (may be null). Runs in O(num_pages) expected time (three
// nth_element partitions). INVALID_ARGUMENT naming `group` and the page for non-finite scores, an
// evicted protected page, or more evicted pages than the target; `out` is then unspecified.
absl::StatusOr<GroupStats> SelectGroup(absl::Span<const float> scores,
                                       absl::Span<const Tier> current,
                                       const ProtectedPages& protected_pages, uint32_t page_tokens,
                                       uint64_t length, const Budgets& budgets, uint32_t group,
                                       absl::Span<Tier> out, std::vector<uint64_t>* scratch,
                                       SelectMethod method = SelectMethod::kNthElement);

// A key whose unsigned order is the order of (score, page): the float's bits made monotone in
// the high word, the page in the low word. Exposed for the benchmark's full-sort baseline.
// Inline: SelectGroup calls it once per candidate page (out of line, the call was 8% of an
// in-process snapshot's profile).
inline uint64_t RankKey(float score, uint32_t page) {
  uint32_t bits = std::bit_cast<uint32_t>(score + 0.0f);  // -0 ranks as +0
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (uint64_t{bits} << 32) | page;
}

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_SELECTION_H_
