#include "core/tiering/schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvtier::tiering {

absl::StatusOr<std::vector<double>> ShareLinks(absl::Span<const double> link_bytes_per_second,
                                               absl::Span<const LinkDemand> demands) {
  for (size_t l = 0; l < link_bytes_per_second.size(); ++l) {
    const double c = link_bytes_per_second[l];
    if (!std::isfinite(c) || c < 0) {
      return absl::InvalidArgumentError(absl::StrCat("link ", l, ": capacity ", c, " bytes/s"));
    }
  }
  std::vector<std::vector<uint32_t>> by_link(link_bytes_per_second.size());
  for (size_t i = 0; i < demands.size(); ++i) {
    const LinkDemand& d = demands[i];
    if (d.link >= link_bytes_per_second.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("demand ", i, ": link ", d.link, " of ", link_bytes_per_second.size()));
    }
    if (!std::isfinite(d.bytes_per_second) || d.bytes_per_second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("demand ", i, ": ", d.bytes_per_second, " bytes/s"));
    }
    by_link[d.link].push_back(static_cast<uint32_t>(i));
  }
  std::vector<double> share(demands.size(), 0.0);
  for (size_t l = 0; l < by_link.size(); ++l) {
    // Smallest demands first: each takes min(its demand, an equal split of what is left).
    std::vector<uint32_t>& ids = by_link[l];
    std::sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) {
      return demands[a].bytes_per_second < demands[b].bytes_per_second;
    });
    double left = link_bytes_per_second[l];
    for (size_t k = 0; k < ids.size(); ++k) {
      const double fair = left / static_cast<double>(ids.size() - k);
      share[ids[k]] = std::min(demands[ids[k]].bytes_per_second, fair);
      left -= share[ids[k]];
    }
  }
  return share;
}

StepSchedule SchedulePages(absl::Span<const SchedulePage> pages, const ScheduleBudget& budget) {
  std::vector<uint32_t> order(pages.size());
  std::iota(order.begin(), order.end(), 0u);
  // Hottest first; ties by index, so the schedule is a function of its inputs.
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return pages[a].score > pages[b].score; });
  StepSchedule s;
  for (uint32_t i : order) {
    const uint64_t bytes = pages[i].bytes;
    if (s.resident_bytes + bytes <= budget.staging_bytes) {
      s.resident.push_back(i);
      s.resident_bytes += bytes;
    } else if (s.staged_bytes + bytes <= budget.h2d_bytes_per_step) {
      s.staged.push_back(i);
      s.staged_bytes += bytes;
    } else {
      s.in_place.push_back(i);
      s.in_place_bytes += bytes;
    }
  }
  return s;
}

}  // namespace kvtier::tiering
