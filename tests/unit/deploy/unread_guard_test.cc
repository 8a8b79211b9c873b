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

TEST(UnreadTrackerTest, APeerThatSentNothingSinceItGotStuckIsKeptAndItsClockStartsOver) {
  UnreadTracker t(absl::Milliseconds(500));
  std::vector<absl::Duration> asked;
  bool quiet = true;
  const UnreadTracker::Quiet peer = [&](uint64_t key, absl::Duration stuck_for) {
    EXPECT_EQ(key, 9u);
    asked.push_back(stuck_for);
    return quiet;
  };
  EXPECT_TRUE(t.Update(At(0), {{9, 0}}, peer).empty());
  EXPECT_TRUE(t.Update(At(100), {{9, 768}}, peer).empty());  // stuck from here
  EXPECT_TRUE(t.Update(At(400), {{9, 768}}, peer).empty());
  EXPECT_TRUE(asked.empty());  // asked only once the timeout is up
  EXPECT_TRUE(t.Update(At(500), {{9, 768}}, peer).empty());
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], absl::Milliseconds(400));  // since the first stuck sample, not since 0
  // Kept: the clock starts over at 500, so nothing is asked before 1000.
  EXPECT_TRUE(t.Update(At(900), {{9, 768}}, peer).empty());
  EXPECT_EQ(asked.size(), 1u);
  // The peer calls again and still reads nothing: dropped at the next timeout.
  quiet = false;
  EXPECT_EQ(t.Update(At(1000), {{9, 768}}, peer), std::vector<uint64_t>{9});
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], absl::Milliseconds(500));  // a call since 500 counts
}

}  // namespace
}  // namespace kvtier::daemon
