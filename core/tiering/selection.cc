#include "core/tiering/selection.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/tiering/lost_mass.h"

namespace kvtier::tiering {
namespace {

// Orders `keys` so that [0, a) < [a, b) < [b, n) element-wise, each boundary by nth_element.
// The middle cut goes first so each element is partitioned about twice, not three times.
void PartitionAt(std::vector<uint64_t>& keys, size_t a, size_t b, size_t c) {
  auto at = [&](size_t i) { return keys.begin() + static_cast<ptrdiff_t>(i); };
  const size_t n = keys.size();
  auto cut = [&](size_t lo, size_t mid, size_t hi) {
    if (mid > lo && mid < hi) std::nth_element(at(lo), at(mid), at(hi));
  };
  cut(0, b, n);
  cut(0, a, b);
  cut(b, c, n);
}

}  // namespace

bool ProtectedPages::Contains(uint64_t page) const {
  for (const Range& r : ranges) {
    if (page < r.begin) return false;
    if (page < r.end) return true;
  }
  return false;
}

uint64_t ProtectedPages::CandidatePages() const {
  uint64_t covered = 0;
  for (const Range& r : ranges) covered += r.end - r.begin;
  return num_pages - covered;
}

ProtectedPages MakeProtectedPages(uint64_t length, uint32_t page_tokens,
                                  absl::Span<const Range> positions) {
  ProtectedPages out;
  out.num_pages = (length + page_tokens - 1) / page_tokens;
  std::vector<Range> pages;
  for (const Range& r : positions) {
    const uint64_t end = std::min(r.end, length);
    if (r.begin >= end) continue;
    pages.push_back({r.begin / page_tokens, (end - 1) / page_tokens + 1});
  }
  if (length % page_tokens != 0) pages.push_back({out.num_pages - 1, out.num_pages});
  std::sort(pages.begin(), pages.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  for (const Range& r : pages) {
    if (!out.ranges.empty() && r.begin <= out.ranges.back().end) {
      out.ranges.back().end = std::max(out.ranges.back().end, r.end);
    } else {
      out.ranges.push_back(r);
    }
  }
  for (const Range& r : out.ranges) {
    const uint64_t end = std::min<uint64_t>(length, r.end * page_tokens);
    out.protected_tokens += end - r.begin * page_tokens;
  }
  return out;
}

ProtectedPages HierarchyProtectedPages(const TieringConfig& config, const SequenceState& seq) {
  const uint64_t prompt = std::min(seq.prompt_tokens, seq.length);
  const uint64_t window_begin =
      seq.length > config.window_tokens ? seq.length - config.window_tokens : 0;
  const uint64_t prompt_begin =
      config.protect_prompt ? std::min(seq.protected_prompt_begin, prompt) : 0;
  const Range ranges[] = {
      {prompt_begin, config.protect_prompt ? prompt : 0},
      {prompt, prompt + config.sink_tokens},
      {window_begin, seq.length},
  };
  return MakeProtectedPages(seq.length, config.page_tokens, ranges);
}

namespace {

// How many of the `wanted` lowest-ranked keys can be evicted while the evicted pages' estimated
// mass (already + theirs, lowest rank first) stays <= epsilon. Sorts keys[0, wanted) ascending
// when epsilon is finite; +inf returns `wanted` untouched, so ε = ∞ is exactly fixed r.
uint64_t EvictionsWithinLostMass(std::vector<uint64_t>& keys, uint64_t wanted,
                                 absl::Span<const float> scores, uint32_t page_tokens,
                                 uint64_t length, double already, double epsilon) {
  if (!(epsilon > 0)) return 0;  // ε = 0 turns eviction off, zero-score pages included
  if (std::isinf(epsilon) || wanted == 0) return wanted;
  const auto end = keys.begin() + static_cast<ptrdiff_t>(wanted);
  if (wanted < keys.size()) std::nth_element(keys.begin(), end, keys.end());
  std::sort(keys.begin(), end);
  double mass = already;
  for (uint64_t i = 0; i < wanted; ++i) {
    const auto page = static_cast<uint32_t>(keys[i]);
    mass += PageMassEstimate(scores[page], page, page_tokens, length);
    if (mass > epsilon) return i;
  }
  return wanted;
}

}  // namespace

uint64_t TargetEvictedPages(double evict_ratio, uint64_t candidate_pages, uint32_t page_tokens) {
  return FloorRatio(evict_ratio, candidate_pages * page_tokens) / page_tokens;
}

absl::StatusOr<GroupStats> SelectGroup(absl::Span<const float> scores,
                                       absl::Span<const Tier> current,
                                       const ProtectedPages& protected_pages, uint32_t page_tokens,
                                       uint64_t length, const Budgets& budgets, uint32_t group,
                                       absl::Span<Tier> out, std::vector<uint64_t>* scratch,
                                       SelectMethod method) {
  const uint64_t n = protected_pages.num_pages;
  if (scores.size() != n || out.size() != n || current.size() > n) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group, ": page_scores has ",
                                                   scores.size(), " pages, placement ",
                                                   current.size(), ", expected ", n));
  }
  std::vector<uint64_t> local;
  std::vector<uint64_t>& keys = scratch != nullptr ? *scratch : local;
  keys.clear();
  keys.reserve(n);
  GroupStats stats;
  stats.candidate_pages = protected_pages.CandidatePages();
  stats.protected_tokens = protected_pages.protected_tokens;
  // Evicted pages stay T3 whatever else holds: after a rollback (TieredSequence::Truncate) the
  // recent window can reach back over them and the eviction budget shrink below them.
  uint64_t already_evicted = 0, evicted_protected = 0;
  double evicted_mass = 0;  // their PageMassEstimate, for max_lost_mass
  // One pass: protected pages to T0, evicted pages stay T3, live candidates become keys.
  auto range = protected_pages.ranges.begin();
  for (uint64_t p = 0; p < n; ++p) {
    const float s = scores[p];
    if (!std::isfinite(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_scores[group ", group, ", page ", p, "] is ", s));
    }
    while (range != protected_pages.ranges.end() && range->end <= p) ++range;
    const bool is_protected = range != protected_pages.ranges.end() && range->begin <= p;
    const Tier now = p < current.size() ? current[p] : Tier::kT0;
    if (now == Tier::kT3) {
      ++(is_protected ? evicted_protected : already_evicted);
      evicted_mass += PageMassEstimate(s, static_cast<uint32_t>(p), page_tokens, length);
      out[p] = Tier::kT3;
    } else if (is_protected) {
      out[p] = Tier::kT0;
    } else {
      keys.push_back(RankKey(s, static_cast<uint32_t>(p)));
    }
  }
  // Candidates evicted: the budget's, or more when a rollback left more than it now allows.
  const uint64_t ratio_target = std::max(
      TargetEvictedPages(budgets.evict_ratio, stats.candidate_pages, page_tokens), already_evicted);
  const uint64_t live = keys.size();
  const uint64_t new_evictions =
      EvictionsWithinLostMass(keys, ratio_target - already_evicted, scores, page_tokens, length,
                              evicted_mass, budgets.max_lost_mass);
  const uint64_t target = already_evicted + new_evictions;
  const uint64_t survivors = live - new_evictions;
  const uint64_t evicted = target + evicted_protected;
  const uint64_t live_tokens = length - std::min(length, evicted * page_tokens);
  stats.evicted_pages = evicted;
  // Protected pages already evicted hold no T0.
  stats.protected_tokens -= std::min(stats.protected_tokens, evicted_protected * page_tokens);
  stats.t0_budget_tokens = CeilRatio(budgets.hbm_ratio, live_tokens);
  uint64_t t0_room = 0;
  if (stats.protected_tokens > stats.t0_budget_tokens) {
    stats.overflow_tokens = stats.protected_tokens - stats.t0_budget_tokens;
  } else {
    t0_room = (stats.t0_budget_tokens - stats.protected_tokens) / page_tokens;
  }
  const uint64_t t2 = FloorRatio(budgets.compress_ratio, survivors);
  const uint64_t t0 = std::min(t0_room, survivors - t2);
  // keys ascending: [0, a) T3, [a, b) T2, [b, c) T1, [c, live) T0.
  const size_t a = new_evictions, b = a + t2, c = live - t0;
  if (method == SelectMethod::kFullSort) {
    std::sort(keys.begin(), keys.end());
  } else {
    PartitionAt(keys, a, b, c);
  }
  for (size_t i = 0; i < live; ++i) {
    const Tier t = i < a ? Tier::kT3 : i < b ? Tier::kT2 : i < c ? Tier::kT1 : Tier::kT0;
    out[static_cast<uint32_t>(keys[i])] = t;
  }
  stats.pages = {n - stats.candidate_pages - evicted_protected + t0, survivors - t0 - t2, t2,
                 evicted};
  return stats;
}

}  // namespace kvtier::tiering
