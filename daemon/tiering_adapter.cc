#include "daemon/tiering_adapter.h"

#include <cmath>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/tiering/config.h"
#include "core/tiering/plan.h"

namespace kvtier::daemon {
namespace {

constexpr uint32_t kMaxSinkOrWindow = 1u << 24;

absl::Status RequireRatio(const char* field, double v) {
  if (std::isfinite(v) && v >= 0.0 && v <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("policy.", field, " must be in [0, 1], got ", v));
}

absl::Status CheckFields(const v1::PolicyConfig& c) {
  if (absl::Status s = RequireRatio("hbm_ratio", c.hbm_ratio()); !s.ok()) return s;
  if (absl::Status s = RequireRatio("evict_ratio", c.evict_ratio()); !s.ok()) return s;
  if (absl::Status s = RequireRatio("compress_ratio", c.compress_ratio()); !s.ok()) return s;
  if (c.evict_ratio() + c.compress_ratio() > 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy.evict_ratio + policy.compress_ratio must be <= 1, got ",
                     c.evict_ratio(), " + ", c.compress_ratio()));
  }
  if (c.has_max_lost_mass() && !(c.max_lost_mass() >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.max_lost_mass must be >= 0 (unset = no limit), got ", c.max_lost_mass()));
  }
  if (c.sink_tokens() > kMaxSinkOrWindow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.sink_tokens must be <= ", kMaxSinkOrWindow, ", got ", c.sink_tokens()));
  }
  if (c.window_tokens() > kMaxSinkOrWindow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.window_tokens must be <= ", kMaxSinkOrWindow, ", got ", c.window_tokens()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PolicySpec> ValidatePolicy(const v1::PolicyConfig& c, uint32_t page_tokens) {
  const std::string shown = absl::CHexEscape(c.name().substr(0, 64));
  if (absl::Status s = CheckFields(c); !s.ok()) return s;
  PolicySpec p;
  p.name = c.name();
  p.hbm_ratio = c.hbm_ratio();
  p.evict_ratio = c.evict_ratio();
  p.compress_ratio = c.compress_ratio();
  p.sink_tokens = c.sink_tokens() == 0 ? 4 : c.sink_tokens();
  p.window_tokens = c.window_tokens() == 0 ? 128 : c.window_tokens();
  p.protect_prompt = c.protect_prompt();
  p.page_score_max = c.page_score_max();
  if (c.has_max_lost_mass()) p.max_lost_mass = c.max_lost_mass();
  p.page_tokens = page_tokens;

  tiering::TieringConfig config;
  config.page_tokens = page_tokens;
  config.sink_tokens = p.sink_tokens;
  config.window_tokens = p.window_tokens;
  config.protect_prompt = p.protect_prompt;
  config.page_score = p.page_score_max ? tiering::kMax : tiering::kSum;
  config.budgets.hbm_ratio = p.hbm_ratio;
  config.budgets.evict_ratio = p.evict_ratio;
  config.budgets.compress_ratio = p.compress_ratio;
  config.budgets.max_lost_mass = p.max_lost_mass;
  absl::StatusOr<std::unique_ptr<tiering::Policy>> policy = tiering::MakePolicy(c.name(), config);
  if (!policy.ok()) {
    if (c.name().empty() || policy.status().message().find("name") != absl::string_view::npos ||
        policy.status().message().find(c.name()) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy.name \"", shown, "\" is unknown; the daemon serves hierarchy, full, streaming"));
    }
    return absl::InvalidArgumentError(absl::StrCat("policy.", policy.status().message()));
  }
  if ((*policy)->NeedsWorkerState()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy.name \"", shown,
        "\" needs per-head worker-side state; the daemon serves hierarchy, full, streaming"));
  }
  p.impl = std::move(*policy);
  return p;
}

bool AllowsCompression(const PolicySpec& policy) {
  return policy.name == "hierarchy" && policy.compress_ratio > 0.0;
}

absl::StatusOr<Decision> DecidePlacement(const PolicySpec& policy,
                                         const tiering::SequenceState& sequence,
                                         const tiering::Placement& current,
                                         absl::Span<const float> scores) {
  tiering::DecisionInput input{sequence, current, scores};
  absl::StatusOr<tiering::Decision> d = policy.impl->DecideDetailed(input);
  if (!d.ok()) return d.status();
  return Decision{std::move(d->placement), d->protected_overflow_tokens > 0};
}

absl::StatusOr<std::vector<tiering::Move>> OrderedMoves(const tiering::Placement& current,
                                                        const tiering::Placement& target) {
  absl::StatusOr<tiering::Plan> plan = tiering::MakePlan(current, target);
  if (!plan.ok()) {
    // The core only diffs placements derived from `current`: this is a bug, not bad input.
    return absl::InternalError(absl::StrCat("plan diff failed: ", plan.status().message()));
  }
  return std::move(plan->moves);
}

}  // namespace kvtier::daemon
