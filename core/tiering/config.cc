#include "core/tiering/config.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::tiering {
namespace {

absl::Status RequireUnitRatio(absl::string_view field, double value) {
  if (std::isfinite(value) && value >= 0.0 && value <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be in [0, 1], got ", value));
}

// The tolerance below which r × n is taken to be an integer.
double Slack(double product) { return 1e-9 * std::max(1.0, std::abs(product)); }

}  // namespace

std::string_view PageScoreModeName(PageScoreMode mode) {
  return mode == PageScoreMode::kMax ? "max" : "sum";
}

absl::Status Budgets::Validate() const {
  if (auto s = RequireUnitRatio("budgets.evict_ratio", evict_ratio); !s.ok()) return s;
  if (auto s = RequireUnitRatio("budgets.hbm_ratio", hbm_ratio); !s.ok()) return s;
  if (auto s = RequireUnitRatio("budgets.compress_ratio", compress_ratio); !s.ok()) return s;
  if (evict_ratio + compress_ratio > 1.0 + 1e-12) {
    return absl::InvalidArgumentError(
        absl::StrCat("budgets.evict_ratio + budgets.compress_ratio must not exceed 1, got ",
                     evict_ratio, " + ", compress_ratio, " = ", evict_ratio + compress_ratio));
  }
  if (!(max_lost_mass >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("budgets.max_lost_mass must be >= 0 (inf = no limit), got ", max_lost_mass));
  }
  return absl::OkStatus();
}

absl::Status TieringConfig::Validate() const {
  if (page_tokens == 0) {
    return absl::InvalidArgumentError("page_tokens must be positive, got 0");
  }
  if (retier_interval == 0) {
    return absl::InvalidArgumentError("retier_interval must be positive, got 0");
  }
  if (page_score != PageScoreMode::kSum && page_score != PageScoreMode::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_score must be sum or max, got ", static_cast<int>(page_score)));
  }
  return budgets.Validate();
}

uint64_t FloorRatio(double ratio, uint64_t n) {
  const double product = ratio * static_cast<double>(n);
  const auto result = static_cast<uint64_t>(std::floor(product + Slack(product)));
  return result > n ? n : result;
}

uint64_t CeilRatio(double ratio, uint64_t n) {
  const double product = ratio * static_cast<double>(n);
  const double c = std::ceil(product - Slack(product));
  const auto result = static_cast<uint64_t>(c < 0 ? 0 : c);
  return result > n ? n : result;
}

}  // namespace kvtier::tiering
