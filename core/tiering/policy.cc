#include "core/tiering/policy.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"

namespace kvtier::tiering {

absl::StatusOr<Placement> TargetShape(const SequenceState& sequence, const Placement& cur,
                                      uint32_t page_tokens) {
  const uint64_t pages = (sequence.length + page_tokens - 1) / page_tokens;
  if (sequence.prompt_tokens > sequence.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence.prompt_tokens (", sequence.prompt_tokens,
                     ") exceeds sequence.length (", sequence.length, ")"));
  }
  if (cur.num_groups == 0) {
    return absl::InvalidArgumentError("current.num_groups must be positive, got 0");
  }
  if (cur.tiers.size() != uint64_t{cur.num_groups} * cur.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "current.tiers has ", cur.tiers.size(),
        " entries, expected num_groups × num_pages = ", uint64_t{cur.num_groups} * cur.num_pages));
  }
  if (cur.num_pages > pages) {
    return absl::InvalidArgumentError(absl::StrCat("current.num_pages (", cur.num_pages,
                                                   ") exceeds the ", pages, " pages of a ",
                                                   sequence.length, "-token sequence"));
  }
  if (pages > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence.length ", sequence.length, " needs more than 2^32 pages"));
  }
  Placement target;
  target.num_groups = cur.num_groups;
  target.num_pages = static_cast<uint32_t>(pages);
  target.tiers.assign(uint64_t{target.num_groups} * pages, Tier::kT0);
  return target;
}

namespace {

absl::Status CheckScores(const DecisionInput& in, const Placement& target) {
  if (in.page_scores.size() == target.tiers.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "page_scores has ", in.page_scores.size(), " entries, expected num_groups × pages = ",
      target.num_groups, " × ", target.num_pages, " = ", target.tiers.size()));
}

// Runs SelectGroup for every group with one protected set and one budget.
absl::StatusOr<Decision> SelectAll(const DecisionInput& in, Placement target,
                                   const ProtectedPages& protected_pages, uint32_t page_tokens,
                                   const Budgets& budgets, absl::Span<const float> scores,
                                   bool scores_per_group) {
  Decision d;
  std::vector<uint64_t> scratch;
  const uint32_t n = target.num_pages;
  for (uint32_t g = 0; g < target.num_groups; ++g) {
    auto group_scores = scores_per_group ? scores.subspan(size_t{g} * n, n) : scores;
    auto current = absl::MakeConstSpan(in.current.tiers)
                       .subspan(size_t{g} * in.current.num_pages, in.current.num_pages);
    auto out = absl::MakeSpan(target.tiers).subspan(size_t{g} * n, n);
    ASSIGN_OR_RETURN(GroupStats stats,
                     SelectGroup(group_scores, current, protected_pages, page_tokens,
                                 in.sequence.length, budgets, g, out, &scratch));
    d.protected_overflow_tokens = std::max(d.protected_overflow_tokens, stats.overflow_tokens);
    d.groups.push_back(stats);
  }
  d.placement = std::move(target);
  return d;
}

// DESIGN.md §2. Scores are cumulative attention; see core/tiering/scores.h.
class HierarchyPolicy final : public Policy {
 public:
  explicit HierarchyPolicy(const TieringConfig& config) : Policy(config) {}
  std::string_view Name() const override { return "hierarchy"; }
  bool NeedsWorkerState() const override { return false; }
  absl::StatusOr<Decision> DecideDetailed(const DecisionInput& in) const override {
    ASSIGN_OR_RETURN(Placement target, TargetShape(in.sequence, in.current, config().page_tokens));
    RETURN_IF_ERROR(CheckScores(in, target));
    return SelectAll(in, std::move(target), HierarchyProtectedPages(config(), in.sequence),
                     config().page_tokens, config().budgets, in.page_scores, true);
  }
};

// No eviction, no offload: every page in T0. A placement with evicted pages contradicts it.
class FullPolicy final : public Policy {
 public:
  explicit FullPolicy(const TieringConfig& config) : Policy(config) {}
  std::string_view Name() const override { return "full"; }
  bool NeedsWorkerState() const override { return false; }
  absl::StatusOr<Decision> DecideDetailed(const DecisionInput& in) const override {
    ASSIGN_OR_RETURN(Placement target, TargetShape(in.sequence, in.current, config().page_tokens));
    // Selection keeps evicted pages evicted (rollbacks); full never had any to keep.
    for (uint32_t g = 0; g < in.current.num_groups; ++g) {
      for (uint32_t p = 0; p < in.current.num_pages; ++p) {
        if (in.current.at(g, p) != Tier::kT3) continue;
        return absl::InvalidArgumentError(absl::StrCat("current evicts page ", p, " of group ", g,
                                                       ", but the full policy keeps every page"));
      }
    }
    std::vector<float> zeros(target.num_pages, 0.0f);
    return SelectAll(in, std::move(target), HierarchyProtectedPages(config(), in.sequence),
                     config().page_tokens, Budgets{}, zeros, false);
  }
};

// StreamingLLM (Xiao et al., 2024): attention sinks + the most recent tokens; everything else is
// evicted, oldest first. The score is recency (the page index); page_scores are not read.
// Sinks: the first sink_tokens positions of the sequence when the prompt is not protected (the
// published form), the first sink_tokens generated positions otherwise. evict_ratio = 1 keeps
// exactly sinks + window (+ prompt); r < 1 widens the recent window to the eviction budget.
// Survivors stay in T0: an eviction baseline never offloads.
class StreamingPolicy final : public Policy {
 public:
  explicit StreamingPolicy(const TieringConfig& config) : Policy(config) {}
  std::string_view Name() const override { return "streaming"; }
  bool NeedsWorkerState() const override { return false; }
  absl::StatusOr<Decision> DecideDetailed(const DecisionInput& in) const override {
    ASSIGN_OR_RETURN(Placement target, TargetShape(in.sequence, in.current, config().page_tokens));
    const TieringConfig& c = config();
    const SequenceState& s = in.sequence;
    const uint64_t window_begin = s.length > c.window_tokens ? s.length - c.window_tokens : 0;
    const uint64_t sink_begin = c.protect_prompt ? s.prompt_tokens : 0;
    const uint64_t prompt_begin =
        c.protect_prompt ? std::min(s.protected_prompt_begin, s.prompt_tokens) : 0;
    const Range ranges[] = {{prompt_begin, c.protect_prompt ? s.prompt_tokens : 0},
                            {sink_begin, sink_begin + c.sink_tokens},
                            {window_begin, s.length}};
    std::vector<float> recency(target.num_pages);
    for (uint32_t p = 0; p < target.num_pages; ++p) recency[p] = static_cast<float>(p);
    const Budgets budgets{
        .evict_ratio = c.budgets.evict_ratio, .hbm_ratio = 1, .compress_ratio = 0};
    return SelectAll(in, std::move(target), MakeProtectedPages(s.length, c.page_tokens, ranges),
                     c.page_tokens, budgets, recency, false);
  }
};

// h2o, rkv, arkv: their state lives in the worker.
class WorkerOnlyPolicy final : public Policy {
 public:
  WorkerOnlyPolicy(std::string_view name, std::string_view entry, const TieringConfig& config)
      : Policy(config), name_(name), entry_(entry) {}
  std::string_view Name() const override { return name_; }
  bool NeedsWorkerState() const override { return true; }
  absl::StatusOr<Decision> DecideDetailed(const DecisionInput&) const override {
    return absl::FailedPreconditionError(
        absl::StrCat("policy '", std::string(name_),
                     "' needs per-head attention state or key vectors that only the "
                     "worker holds; a page-score snapshot cannot drive it. Run it in the worker (",
                     std::string(entry_), ")"));
  }

 private:
  std::string_view name_;
  std::string_view entry_;
};

}  // namespace

absl::StatusOr<Placement> Policy::Decide(const DecisionInput& input) const {
  ASSIGN_OR_RETURN(Decision d, DecideDetailed(input));
  return std::move(d.placement);
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name,
                                                   const TieringConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  if (name == "hierarchy") return std::make_unique<HierarchyPolicy>(config);
  if (name == "full") return std::make_unique<FullPolicy>(config);
  if (name == "streaming") return std::make_unique<StreamingPolicy>(config);
  if (name == "h2o") {
    return std::make_unique<WorkerOnlyPolicy>("h2o", "core/tiering/h2o.h: H2oSelect", config);
  }
  if (name == "rkv") {
    return std::make_unique<WorkerOnlyPolicy>("rkv", "core/tiering/rkv.h: RkvCompress", config);
  }
  if (name == "arkv") {
    return std::make_unique<WorkerOnlyPolicy>("arkv", "core/tiering/arkv.h: ArkvDecide", config);
  }
  std::string names;
  for (std::string_view n : kPolicyNames)
    absl::StrAppend(&names, names.empty() ? "" : "|", std::string(n));
  return absl::InvalidArgumentError(
      absl::StrCat("policy name must be one of ", names, ", got '", std::string(name), "'"));
}

}  // namespace kvtier::tiering
