#include "daemon/tiering_adapter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

// The tiering library (core/tiering, branch `tiering`) had not landed when this was written: the
// decision below is a minimal in-daemon implementation of DESIGN.md §2 (hierarchy, full,
// streaming). When core/tiering lands, DecidePlacement and OrderedMoves call it instead.

namespace kvtier::daemon {
namespace {

using tiering::Placement;
using tiering::Tier;

constexpr uint32_t kMaxSinkOrWindow = 1u << 24;

absl::Status RequireRatio(const char* field, double v) {
  if (std::isfinite(v) && v >= 0.0 && v <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("policy.", field, " must be in [0, 1], got ", v));
}

// Token span of page p of a sequence of `length` positions.
struct PageSpan {
  uint64_t begin, end;
};
PageSpan SpanOf(uint32_t p, uint32_t page_tokens, uint64_t length) {
  uint64_t b = uint64_t{p} * page_tokens;
  return {b, std::min<uint64_t>(b + page_tokens, length)};
}

bool Overlaps(PageSpan s, uint64_t b, uint64_t e) { return s.begin < e && b < s.end; }

bool IsProtected(const PolicySpec& pol, uint64_t prompt, uint64_t length, PageSpan s) {
  if (pol.protect_prompt && s.begin < prompt) return true;
  uint64_t sink_begin = pol.name == "streaming" ? 0 : prompt;
  if (Overlaps(s, sink_begin, sink_begin + pol.sink_tokens)) return true;
  uint64_t window_begin = length > pol.window_tokens ? length - pol.window_tokens : 0;
  return s.end > window_begin;
}

// Hierarchy on one group: see DESIGN.md §2. `tiers` and `scores` cover the group's pages.
// Returns whether the protected pages alone exceed the T0 budget.
bool DecideGroup(const PolicySpec& pol, uint64_t prompt, uint64_t length,
                 absl::Span<const Tier> current, absl::Span<const float> scores,
                 absl::Span<Tier> out) {
  const uint32_t n = static_cast<uint32_t>(current.size());
  const uint32_t pt = pol.page_tokens;
  uint64_t eligible = 0, evicted = 0, protected_tokens = 0, live = 0;
  std::vector<uint32_t> cand;  // live, non-protected pages
  for (uint32_t p = 0; p < n; ++p) {
    PageSpan s = SpanOf(p, pt, length);
    uint64_t t = s.end - s.begin;
    bool prot = IsProtected(pol, prompt, length, s);
    if (current[p] == Tier::kT3) {
      out[p] = Tier::kT3;
      evicted += t;
      if (!prot) eligible += t;
      continue;
    }
    live += t;
    if (prot) {
      out[p] = Tier::kT0;
      protected_tokens += t;
    } else {
      eligible += t;
      cand.push_back(p);
    }
  }
  if (pol.name == "full" || pol.name == "streaming") {
    for (uint32_t p : cand) out[p] = pol.name == "full" ? Tier::kT0 : Tier::kT3;
    return false;
  }
  // Lowest score first; ties by position (older first) so the result is deterministic.
  auto lower = [&](uint32_t a, uint32_t b) {
    return scores[a] != scores[b] ? scores[a] < scores[b] : a < b;
  };
  // Candidates are full pages (only the last page can be partial, and it is in the window).
  const uint64_t target_evicted = static_cast<uint64_t>(std::floor(pol.evict_ratio * eligible));
  size_t n_evict = target_evicted > evicted ? (target_evicted - evicted) / pt : 0;
  n_evict = std::min(n_evict, cand.size());
  if (n_evict > 0 && n_evict < cand.size()) {
    std::nth_element(cand.begin(), cand.begin() + n_evict, cand.end(), lower);
  }
  for (size_t i = 0; i < n_evict; ++i) out[cand[i]] = Tier::kT3;
  live -= n_evict * pt;
  absl::Span<uint32_t> survivors(cand.data() + n_evict, cand.size() - n_evict);
  const uint64_t t0_cap = static_cast<uint64_t>(std::ceil(pol.hbm_ratio * live));
  size_t n_t0 = t0_cap > protected_tokens ? (t0_cap - protected_tokens) / pt : 0;
  n_t0 = std::min(n_t0, survivors.size());
  size_t n_t2 = static_cast<size_t>(std::floor(pol.compress_ratio * survivors.size()));
  n_t2 = std::min(n_t2, survivors.size() - n_t0);
  // Bottom n_t2 -> T2, top n_t0 -> T0, the middle -> T1.
  if (n_t2 > 0 && n_t2 < survivors.size()) {
    std::nth_element(survivors.begin(), survivors.begin() + n_t2, survivors.end(), lower);
  }
  auto rest = survivors.subspan(n_t2);
  size_t n_t1 = rest.size() - n_t0;
  if (n_t1 > 0 && n_t1 < rest.size()) {
    std::nth_element(rest.begin(), rest.begin() + n_t1, rest.end(), lower);
  }
  for (size_t i = 0; i < survivors.size(); ++i) {
    out[survivors[i]] = i < n_t2 ? Tier::kT2 : (i < n_t2 + n_t1 ? Tier::kT1 : Tier::kT0);
  }
  return protected_tokens > t0_cap;
}

}  // namespace

absl::StatusOr<PolicySpec> ValidatePolicy(const v1::PolicyConfig& c, uint32_t page_tokens) {
  PolicySpec p;
  if (c.name() == "h2o" || c.name() == "rkv" || c.name() == "arkv") {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.name \"", c.name(),
        "\" needs per-head worker-side state; the daemon serves hierarchy, full, streaming"));
  }
  if (c.name() != "hierarchy" && c.name() != "full" && c.name() != "streaming") {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.name \"", absl::CHexEscape(c.name().substr(0, 64)),
                     "\" is unknown; expected hierarchy, full or streaming"));
  }
  p.name = c.name();
  if (absl::Status s = RequireRatio("hbm_ratio", c.hbm_ratio()); !s.ok()) return s;
  if (absl::Status s = RequireRatio("evict_ratio", c.evict_ratio()); !s.ok()) return s;
  if (absl::Status s = RequireRatio("compress_ratio", c.compress_ratio()); !s.ok()) return s;
  if (c.evict_ratio() + c.compress_ratio() > 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.evict_ratio + policy.compress_ratio must be <= 1, got ",
                     c.evict_ratio(), " + ", c.compress_ratio()));
  }
  if (c.sink_tokens() > kMaxSinkOrWindow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.sink_tokens must be <= ", kMaxSinkOrWindow, ", got ", c.sink_tokens()));
  }
  if (c.window_tokens() > kMaxSinkOrWindow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.window_tokens must be <= ", kMaxSinkOrWindow, ", got ", c.window_tokens()));
  }
  p.hbm_ratio = c.hbm_ratio();
  p.evict_ratio = c.evict_ratio();
  p.compress_ratio = c.compress_ratio();
  p.sink_tokens = c.sink_tokens() == 0 ? 4 : c.sink_tokens();
  p.window_tokens = c.window_tokens() == 0 ? 128 : c.window_tokens();
  p.protect_prompt = c.protect_prompt();
  p.page_score_max = c.page_score_max();
  p.page_tokens = page_tokens;
  return p;
}

bool AllowsCompression(const PolicySpec& policy) {
  return policy.name == "hierarchy" && policy.compress_ratio > 0.0;
}

absl::StatusOr<Decision> DecidePlacement(const PolicySpec& policy, uint64_t prompt_tokens,
                                         uint64_t length, const Placement& current,
                                         absl::Span<const float> scores) {
  const size_t total = size_t{current.num_groups} * current.num_pages;
  if (current.tiers.size() != total || scores.size() != total) {
    return absl::InternalError("placement and scores disagree in size");
  }
  Decision d{current, false};
  for (uint32_t g = 0; g < current.num_groups; ++g) {
    size_t off = size_t{g} * current.num_pages;
    d.protected_overflow |=
        DecideGroup(policy, prompt_tokens, length,
                    absl::MakeConstSpan(current.tiers).subspan(off, current.num_pages),
                    scores.subspan(off, current.num_pages),
                    absl::MakeSpan(d.target.tiers).subspan(off, current.num_pages));
  }
  return d;
}

std::vector<tiering::Move> OrderedMoves(const Placement& current, const Placement& target) {
  std::vector<tiering::Move> demotions, promotions;
  for (uint32_t g = 0; g < current.num_groups; ++g) {
    for (uint32_t p = 0; p < current.num_pages; ++p) {
      Tier from = current.at(g, p), to = target.at(g, p);
      if (from == to) continue;
      (to > from ? demotions : promotions).push_back({g, p, from, to});
    }
  }
  demotions.insert(demotions.end(), promotions.begin(), promotions.end());
  return demotions;
}

}  // namespace kvtier::daemon
