// The heartbeat lane's valve: the real-time priority holds while all heartbeats together stay
// under the cap, is given up within the window that crosses it, and comes back only after a whole
// window under it.

#include "daemon/kvtierd/channel_lane.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

constexpr absl::Duration kWindow = absl::Milliseconds(100);

// `n` heartbeats spread evenly over one window from `from`; whether the last one kept priority.
bool Burst(PriorityValve& valve, absl::Time from, int n) {
  bool allowed = true;
  for (int i = 0; i < n; ++i) allowed = valve.Count(from + kWindow * i / n);
  return allowed;
}

TEST(PriorityValveTest, UnderTheCapThePriorityStays) {
  PriorityValve valve(1000, kWindow);  // 100 a window
  const absl::Time t0 = absl::UnixEpoch();
  for (int w = 0; w < 20; ++w) EXPECT_TRUE(Burst(valve, t0 + kWindow * w, 100)) << "window " << w;
}

TEST(PriorityValveTest, AFloodLosesItWithinTheWindowAndAQuietWindowBringsItBack) {
  PriorityValve valve(1000, kWindow);
  const absl::Time t0 = absl::UnixEpoch();
  // The 101st heartbeat of a window is one too many: refused at once, not a window later.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(valve.Count(t0 + absl::Microseconds(i)));
  EXPECT_FALSE(valve.Count(t0 + absl::Microseconds(100)));
  // The next window starts refused (the last one was over) and stays so while it is over too.
  EXPECT_FALSE(Burst(valve, t0 + kWindow, 300));
  // A window under the cap is refused as a whole (the one before was over)...
  EXPECT_FALSE(Burst(valve, t0 + 2 * kWindow, 10));
  // ...and the one after it is the heartbeats' again.
  EXPECT_TRUE(valve.Count(t0 + 3 * kWindow));
}

TEST(PriorityValveTest, ALongSilenceCountsAsQuiet) {
  PriorityValve valve(1000, kWindow);
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(Burst(valve, t0, 500));
  // Nothing for a second after the flood: whole windows passed quiet.
  EXPECT_TRUE(valve.Count(t0 + absl::Seconds(1)));
  // Right after a flood's window, the next is refused (as above): the silence must be whole.
  EXPECT_FALSE(Burst(valve, t0 + absl::Seconds(2), 500));
  EXPECT_FALSE(valve.Count(t0 + absl::Seconds(2) + kWindow + absl::Milliseconds(50)));
}

}  // namespace
}  // namespace kvtier::daemon
