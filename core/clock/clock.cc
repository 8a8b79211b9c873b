#include "core/clock/clock.h"

#include <time.h>

namespace kvtier {

absl::Duration MonotonicClock::Now() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return absl::DurationFromTimespec(ts);
}

Clock* MonotonicClock::Get() {
  static MonotonicClock* const clock = new MonotonicClock();
  return clock;
}

absl::Duration FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  if (d > absl::ZeroDuration()) now_ += d;
}

}  // namespace kvtier
