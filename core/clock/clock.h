#ifndef KVTIER_CORE_CLOCK_CLOCK_H_
#define KVTIER_CORE_CLOCK_CLOCK_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvtier {

// A monotonic clock, injected wherever time decides something (leases, deadlines), so tests
// drive time by hand instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Time since an arbitrary fixed origin; never goes backwards.
  virtual absl::Duration Now() const = 0;
};

// The process's monotonic clock (CLOCK_MONOTONIC). Thread-safe.
class MonotonicClock final : public Clock {
 public:
  absl::Duration Now() const override;
  // A process-wide instance; it holds no state, so sharing it is safe.
  static Clock* Get();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Duration start = absl::ZeroDuration()) : now_(start) {}
  absl::Duration Now() const override;
  // REQUIRES: d >= 0 (monotonic).
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Duration now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_CORE_CLOCK_CLOCK_H_
