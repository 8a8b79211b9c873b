#ifndef KVTIER_DAEMON_PLAN_COUNTS_H_
#define KVTIER_DAEMON_PLAN_COUNTS_H_

// How many plans a sequence (or a worker) got, how many were degraded, and how many lately: what
// status, `kvtierctl top` and the status page show. Pure; thread-compatible (the core's mu_
// guards every instance).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/time/time.h"

namespace kvtier::daemon {

// A recent rate of events: an exponentially decayed count (time constant `tau`), so that a read
// says "events per second lately" without keeping timestamps. A steady rate reads as itself after
// a few `tau`; a stop decays to 0 with `tau`. Times come from the injected clock.
class EventRate {
 public:
  explicit EventRate(absl::Duration tau = absl::Seconds(10)) : tau_s_(absl::ToDoubleSeconds(tau)) {}
  void Add(absl::Duration now) {
    level_ = LevelAt(now) + 1;
    at_ = std::max(at_, now);
  }
  double PerSecond(absl::Duration now) const { return LevelAt(now) / tau_s_; }

 private:
  // Events within ~tau of `now`, decayed by age (a clock read before the last event: no decay).
  double LevelAt(absl::Duration now) const {
    const double age = std::max(0.0, absl::ToDoubleSeconds(now - at_));
    return level_ * std::exp(-age / tau_s_);
  }
  double tau_s_;
  double level_ = 0;
  absl::Duration at_ = absl::ZeroDuration();
};

struct PlanCounts {
  uint64_t plans = 0;
  uint64_t degraded = 0;
  EventRate rate;
  void Add(absl::Duration now, bool was_degraded) {
    ++plans;
    degraded += was_degraded;
    rate.Add(now);
  }
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PLAN_COUNTS_H_
