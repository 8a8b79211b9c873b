#include "worker/cuda/placement_split.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {
namespace {

uint64_t Score(uint64_t seed, uint64_t page) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + page + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool Overlaps(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) { return a0 < b1 && b0 < a1; }

}  // namespace

absl::StatusOr<PageSplit> SplitPages(uint32_t length, uint32_t page_tokens,
                                     const SplitKnobs& knobs) {
  if (length == 0 || page_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("length and page_tokens must be > 0, got ", length, ", ", page_tokens));
  }
  if (!(knobs.hbm_ratio >= 0.0 && knobs.hbm_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hbm_ratio must be in [0, 1], got ", knobs.hbm_ratio));
  }
  if (!(knobs.evict_ratio >= 0.0 && knobs.evict_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("evict_ratio must be in [0, 1], got ", knobs.evict_ratio));
  }
  const uint32_t pages = (length + page_tokens - 1) / page_tokens;
  const uint64_t prompt = std::min(knobs.prompt_tokens, length);
  const uint64_t sink_end = std::min<uint64_t>(prompt + knobs.sink_tokens, length);
  const uint64_t window_begin = length > knobs.window_tokens ? length - knobs.window_tokens : 0;
  PageSplit split;
  split.tier.assign(pages, PageTier::kT1);
  std::vector<uint32_t> candidates;
  for (uint32_t p = 0; p < pages; ++p) {
    const uint64_t b = uint64_t{p} * page_tokens, e = std::min<uint64_t>(b + page_tokens, length);
    if (Overlaps(b, e, 0, sink_end) || Overlaps(b, e, window_begin, length)) {
      split.tier[p] = PageTier::kT0;
      ++split.protected_pages;
    } else {
      candidates.push_back(p);
    }
  }
  split.eligible_pages = static_cast<uint32_t>(candidates.size());
  std::sort(candidates.begin(), candidates.end(), [&](uint32_t a, uint32_t b) {
    const uint64_t sa = Score(knobs.seed, a), sb = Score(knobs.seed, b);
    return sa != sb ? sa > sb : a < b;
  });
  const auto evict = static_cast<uint32_t>(std::floor(knobs.evict_ratio * split.eligible_pages));
  const uint32_t live = pages - evict;
  const auto t0_budget = static_cast<uint32_t>(std::ceil(knobs.hbm_ratio * live));
  const uint32_t t0_candidates =
      t0_budget > split.protected_pages
          ? std::min(t0_budget - split.protected_pages, split.eligible_pages - evict)
          : 0;
  for (uint32_t i = 0; i < candidates.size(); ++i) {
    PageTier t = PageTier::kT1;
    if (i < t0_candidates) t = PageTier::kT0;
    if (i >= candidates.size() - evict) t = PageTier::kEvicted;
    split.tier[candidates[i]] = t;
  }
  for (PageTier t : split.tier) {
    split.t0_pages += t == PageTier::kT0;
    split.t1_pages += t == PageTier::kT1;
    split.evicted_pages += t == PageTier::kEvicted;
  }
  return split;
}

}  // namespace kvtier::worker::cuda
