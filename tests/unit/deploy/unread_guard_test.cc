#include "daemon/kvtierd/unread_guard.h"

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using Samples = std::vector<std::pair<uint64_t, uint64_t>>;

absl::Time At(int ms) { return absl::UnixEpoch() + absl::Milliseconds(ms); }

TEST(UnreadTrackerTest, DropsAConnectionWhoseUnreadBytesNeverWentDownForTheTimeout) {
  UnreadTracker t(absl::Milliseconds(500));
  // The clock runs from the last sample with nothing pending (0 ms).
  EXPECT_TRUE(t.Update(At(0), {{7, 0}}).empty());
  EXPECT_TRUE(t.Update(At(100), {{7, 768}}).empty());
  EXPECT_TRUE(t.Update(At(400), {{7, 90000}}).empty());  // growing is no progress
  EXPECT_TRUE(t.Update(At(499), {{7, 90000}}).empty());
  EXPECT_EQ(t.Update(At(500), {{7, 90000}}), std::vector<uint64_t>{7});
  // Dropped once; seen again, it starts over.
  EXPECT_TRUE(t.Update(At(600), {{7, 90000}}).empty());
}

TEST(UnreadTrackerTest, APeerThatReadsAnythingOrHasNothingPendingIsKept) {
  UnreadTracker t(absl::Milliseconds(500));
  for (int ms = 0; ms <= 5000; ms += 100) {
    // 1: idle; 2: always some bytes unread, but fewer than at the last sample every other time.
    const uint64_t busy = ms % 200 == 0 ? 5000 : 4000;
    EXPECT_TRUE(t.Update(At(ms), {{1, 0}, {2, busy}}).empty()) << ms;
  }
}

TEST(UnreadTrackerTest, ConnectionsThatClosedAreForgotten) {
  UnreadTracker t(absl::Milliseconds(500));
  EXPECT_TRUE(t.Update(At(0), {{3, 0}}).empty());
  EXPECT_TRUE(t.Update(At(100), {{3, 10}}).empty());
  EXPECT_TRUE(t.Update(At(200), {}).empty());  // closed
  // The same key again (a new connection on a reused inode) gets a fresh clock.
  EXPECT_TRUE(t.Update(At(700), {{3, 10}}).empty());
  EXPECT_EQ(t.Update(At(1200), {{3, 10}}), std::vector<uint64_t>{3});
}

}  // namespace
}  // namespace kvtier::daemon
