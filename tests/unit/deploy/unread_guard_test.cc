#include "daemon/kvtierd/unread_guard.h"

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

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

// Row 15 of issue #31: a worker that reads every answer but, at each 100 ms sample, has the
// same number of bytes unread (those kvtierd sent after the answer it just read). The unread
// count never falls, but the peer's reads move: it is never dropped.
TEST(UnreadTrackerTest, APeerThatReadsEveryAnswerButLeavesTheSameCountUnreadIsKept) {
  UnreadTracker t(absl::Milliseconds(500));
  bool asked = false;
  const UnreadTracker::Quiet calling = [&](uint64_t, absl::Duration) {
    asked = true;
    return false;  // it calls all the time
  };
  uint64_t reads = 0;
  for (int ms = 0; ms <= 5000; ms += 100) {
    reads += 3;  // an answer read since the last sample
    EXPECT_TRUE(t.Update(At(ms), {{4, 768, reads}}, calling).empty()) << ms;
  }
  EXPECT_FALSE(asked);
  // The same pattern without a read: stuck, dropped at the timeout.
  for (int ms = 5100; ms < 5500; ms += 100) {
    EXPECT_TRUE(t.Update(At(ms), {{4, 768, reads}}, calling).empty()) << ms;
  }
  EXPECT_EQ(t.Update(At(5500), {{4, 768, reads}}, calling), std::vector<uint64_t>{4});
}

}  // namespace
}  // namespace kvtier::daemon
