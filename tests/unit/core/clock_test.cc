#include "core/clock/clock.h"

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::Seconds(5));
  clock.Advance(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now(), absl::Milliseconds(5250));
}

TEST(FakeClockTest, IgnoresNegativeAdvance) {
  FakeClock clock(absl::Seconds(1));
  clock.Advance(-absl::Seconds(1));
  EXPECT_EQ(clock.Now(), absl::Seconds(1));
}

TEST(MonotonicClockTest, NeverGoesBackwards) {
  Clock* clock = MonotonicClock::Get();
  absl::Duration prev = clock->Now();
  for (int i = 0; i < 10000; ++i) {
    absl::Duration now = clock->Now();
    ASSERT_GE(now, prev);
    prev = now;
  }
}

}  // namespace
}  // namespace kvtier
