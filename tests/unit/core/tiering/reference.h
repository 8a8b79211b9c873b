#ifndef KVTIER_TESTS_UNIT_CORE_TIERING_REFERENCE_H_
#define KVTIER_TESTS_UNIT_CORE_TIERING_REFERENCE_H_

// An independent, deliberately naive model of DESIGN.md §2 for the property tests: token-level
// protection, integer ratio arithmetic (ratios are k/1000), full sort instead of selection.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tiering/types.h"

namespace kvtier::tiering::testing {

struct RefConfig {
  uint32_t page_tokens = 16;
  uint32_t sink_tokens = 4;
  uint32_t window_tokens = 128;
  bool protect_prompt = true;
  uint32_t evict_milli = 0;     // r × 1000
  uint32_t hbm_milli = 1000;    // β × 1000
  uint32_t compress_milli = 0;  // γ × 1000
};

inline bool RefTokenProtected(const RefConfig& c, uint64_t prompt, uint64_t length, uint64_t i) {
  if (c.protect_prompt && i < prompt) return true;
  if (i >= prompt && i < prompt + c.sink_tokens) return true;
  return i + c.window_tokens >= length;
}

inline std::vector<bool> RefProtectedPages(const RefConfig& c, uint64_t prompt, uint64_t length) {
  const uint64_t pages = (length + c.page_tokens - 1) / c.page_tokens;
  std::vector<bool> out(pages, false);
  for (uint64_t i = 0; i < length; ++i) {
    if (RefTokenProtected(c, prompt, length, i)) out[i / c.page_tokens] = true;
  }
  if (length % c.page_tokens != 0) out[pages - 1] = true;
  return out;
}

struct RefGroupResult {
  std::vector<Tier> tiers;
  uint64_t evicted_pages = 0;
  uint64_t t0_budget_tokens = 0;
  uint64_t protected_tokens = 0;
  uint64_t overflow_tokens = 0;
};

// One group: `current` may be shorter than the page count (missing pages are T0).
inline RefGroupResult RefSelect(const RefConfig& c, uint64_t prompt, uint64_t length,
                                const std::vector<float>& scores, std::vector<Tier> current) {
  const std::vector<bool> prot = RefProtectedPages(c, prompt, length);
  const uint64_t pages = prot.size();
  current.resize(pages, Tier::kT0);
  RefGroupResult r;
  r.tiers.assign(pages, Tier::kT0);
  uint64_t candidates = 0, evicted_before = 0;
  std::vector<uint64_t> live;
  for (uint64_t p = 0; p < pages; ++p) {
    if (prot[p]) {
      r.protected_tokens += std::min<uint64_t>(length, (p + 1) * c.page_tokens) - p * c.page_tokens;
      continue;
    }
    ++candidates;
    if (current[p] == Tier::kT3) {
      ++evicted_before;
      r.tiers[p] = Tier::kT3;
    } else {
      live.push_back(p);
    }
  }
  const uint64_t eligible = candidates * c.page_tokens;
  r.evicted_pages = (uint64_t{c.evict_milli} * eligible / 1000) / c.page_tokens;
  const uint64_t new_evict = r.evicted_pages - evicted_before;  // caller checks >= 0
  const uint64_t live_tokens = length - r.evicted_pages * c.page_tokens;
  r.t0_budget_tokens = (uint64_t{c.hbm_milli} * live_tokens + 999) / 1000;
  uint64_t room = 0;
  if (r.protected_tokens > r.t0_budget_tokens) {
    r.overflow_tokens = r.protected_tokens - r.t0_budget_tokens;
  } else {
    room = (r.t0_budget_tokens - r.protected_tokens) / c.page_tokens;
  }
  const uint64_t survivors = live.size() - new_evict;
  const uint64_t t2 = uint64_t{c.compress_milli} * survivors / 1000;
  const uint64_t t0 = std::min(room, survivors - t2);
  std::sort(live.begin(), live.end(), [&](uint64_t a, uint64_t b) {
    return scores[a] != scores[b] ? scores[a] < scores[b] : a < b;
  });
  for (uint64_t i = 0; i < live.size(); ++i) {
    Tier t = Tier::kT1;
    if (i < new_evict) {
      t = Tier::kT3;
    } else if (i < new_evict + t2) {
      t = Tier::kT2;
    } else if (i >= live.size() - t0) {
      t = Tier::kT0;
    }
    r.tiers[live[i]] = t;
  }
  return r;
}

}  // namespace kvtier::tiering::testing

#endif  // KVTIER_TESTS_UNIT_CORE_TIERING_REFERENCE_H_
