// The core's lock discipline: a snapshot's policy decision runs without the registry lock, so
// heartbeats, acks, status and other sequences' snapshots complete while one is held; a
// sequence freed meanwhile makes the held snapshot give up without leaking a slot. A test hook
// holds the decision on a latch: no timing is measured (the latch's timeout only turns a
// deadlock into a failure instead of a hang).

#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon::testing {
namespace {

constexpr absl::Duration kDeadlockBreaker = absl::Seconds(60);

// A core whose decision for `held_sequence` waits until `release` (or the deadlock breaker).
struct HeldCore {
  HeldCore() : metrics(Metrics::Create()) {
    internal::CoreHooks hooks;
    hooks.during_decision = [this](uint64_t sequence_id) {
      if (sequence_id != held_sequence.load()) return;
      entered.Notify();
      released_in_time = release.WaitForNotificationWithTimeout(kDeadlockBreaker);
    };
    core = std::make_unique<internal::DaemonCoreImpl>(SmallOptions(), &clock, metrics.get(),
                                                      /*epoch=*/7, std::move(hooks));
  }
  FakeClock clock;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<internal::DaemonCoreImpl> core;
  std::atomic<uint64_t> held_sequence{0};
  absl::Notification entered, release;
  bool released_in_time = false;  // written by the snapshot's thread, read after join
};

TEST(DaemonCoreLockTest, HeartbeatsAcksStatusAndOtherSnapshotsCompleteDuringADecision) {
  HeldCore env;
  SimWorker a(env.core.get()), b(env.core.get());
  const v1::PolicyConfig policy = Policy("hierarchy", 0.5, 0.0, 0.0);
  auto held = a.Open(16, policy);
  auto other = a.Open(16, policy);
  auto theirs = b.Open(16, policy);
  ASSERT_TRUE(held.ok() && other.ok() && theirs.ok());
  // `other` gets a plan in flight first, to be acknowledged while the decision is held.
  auto pending = a.Snapshot(*other, 640, RampScores(40, 3));
  ASSERT_TRUE(pending.ok()) << pending.status();

  env.held_sequence = *held;
  absl::StatusOr<v1::TierPlan> plan;
  std::thread snapshot([&] { plan = a.Snapshot(*held, 640, RampScores(40)); });
  ASSERT_TRUE(env.entered.WaitForNotificationWithTimeout(kDeadlockBreaker));

  // All of these would wait for the held decision if it held the registry lock.
  EXPECT_TRUE(a.Heartbeat().ok());
  EXPECT_TRUE(b.Heartbeat().ok());
  EXPECT_TRUE(a.Ack(*pending, true).ok());
  v1::GetStatusRequest status;
  status.set_include_sequences(true);
  status.set_include_workers(true);
  auto st = env.core->GetStatus(a.Signed(status));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->sequence_list_size(), 2);
  auto their_plan = b.Snapshot(*theirs, 640, RampScores(40, 5));
  ASSERT_TRUE(their_plan.ok()) << their_plan.status();
  EXPECT_TRUE(b.Ack(*their_plan, true).ok());
  EXPECT_TRUE(env.core->CheckInvariants().ok()) << env.core->CheckInvariants();
  env.release.Notify();
  snapshot.join();

  EXPECT_TRUE(env.released_in_time) << "a request waited for the held decision";
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->move_page_size(), 0);
  EXPECT_TRUE(a.Ack(*plan, true).ok());
  EXPECT_TRUE(env.core->CheckInvariants().ok()) << env.core->CheckInvariants();
}

// A worker with one sequence whose first snapshot's decision is held: `free` runs meanwhile
// (it frees the sequence one way or another), then the decision goes on and must give up.
void FreedDuringItsDecisionLeaksNothing(
    const std::function<void(HeldCore&, SimWorker&, uint64_t sequence)>& free) {
  HeldCore env;
  SimWorker a(env.core.get());
  auto seq = a.Open(16, Policy("hierarchy", 0.3, 0.0, 0.3));
  ASSERT_TRUE(seq.ok());
  env.held_sequence = *seq;
  absl::StatusOr<v1::TierPlan> plan;
  std::thread snapshot([&] { plan = a.Snapshot(*seq, 640, RampScores(40)); });
  ASSERT_TRUE(env.entered.WaitForNotificationWithTimeout(kDeadlockBreaker));
  free(env, a, *seq);
  env.release.Notify();
  snapshot.join();
  EXPECT_TRUE(env.released_in_time) << "freeing the sequence waited for the held decision";
  EXPECT_FALSE(plan.ok());
  EXPECT_TRUE(env.core->CheckInvariants().ok()) << env.core->CheckInvariants();
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).slots_used(), 0u);
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_COMPRESSED).slots_used(), 0u);
}

TEST(DaemonCoreLockTest, SequenceClosedDuringItsDecisionGivesUpAndLeaksNothing) {
  FreedDuringItsDecisionLeaksNothing([](HeldCore& env, SimWorker& a, uint64_t seq) {
    v1::CloseSequenceRequest close = a.Signed(v1::CloseSequenceRequest());
    close.set_sequence_id(seq);
    EXPECT_TRUE(env.core->CloseSequence(close).ok());
  });
}

TEST(DaemonCoreLockTest, WorkerReapedDuringADecisionLeaksNothing) {
  FreedDuringItsDecisionLeaksNothing([](HeldCore& env, SimWorker&, uint64_t) {
    env.clock.Advance(absl::Seconds(11));  // past the 10 s lease
    EXPECT_EQ(env.core->ReapExpired(), 1);
  });
}

// The same sequence's snapshots are serialized: a resubmission while the first is decided
// waits for it and then gets the same plan (its reply was lost), not a second one.
TEST(DaemonCoreLockTest, ResubmissionDuringADecisionGetsTheSamePlan) {
  HeldCore env;
  SimWorker a(env.core.get());
  auto seq = a.Open(16, Policy("hierarchy", 0.5, 0.0, 0.0));
  ASSERT_TRUE(seq.ok());
  const v1::SubmitSnapshotRequest request = a.MakeSnapshot(*seq, 640, RampScores(40));
  env.held_sequence = *seq;
  absl::StatusOr<v1::TierPlan> first, second;
  std::thread t1([&] { first = env.core->SubmitSnapshot(request); });
  ASSERT_TRUE(env.entered.WaitForNotificationWithTimeout(kDeadlockBreaker));
  env.held_sequence = 0;  // the resubmission's own decision (if any) is not held
  std::thread t2([&] { second = env.core->SubmitSnapshot(request); });
  env.release.Notify();
  t1.join();
  t2.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->plan_version(), second->plan_version());
  EXPECT_EQ(first->SerializeAsString(), second->SerializeAsString());
  EXPECT_TRUE(env.core->CheckInvariants().ok()) << env.core->CheckInvariants();
}

// Issue 31, row 8: a snapshot's validation and growth run under the core's lock; leases have a
// lock of their own, so heartbeats (gRPC and channel) complete while a snapshot holds it, and a
// lease that lapses meanwhile is refused by the heartbeat and freed by the reaper.
TEST(DaemonCoreLockTest, HeartbeatsCompleteWhileASnapshotHoldsTheCoreLock) {
  FakeClock clock;
  absl::Notification entered, release;
  std::atomic<uint64_t> held_sequence{0};
  bool released_in_time = false;
  internal::CoreHooks hooks;
  hooks.holding_core_lock = [&](uint64_t sequence_id) {
    if (sequence_id != held_sequence.load()) return;
    entered.Notify();
    released_in_time = release.WaitForNotificationWithTimeout(kDeadlockBreaker);
  };
  internal::DaemonCoreImpl core(SmallOptions(), &clock, nullptr, /*epoch=*/7, std::move(hooks));
  SimWorker a(&core), b(&core), lapsing(&core);
  auto seq = a.Open(16, Policy("hierarchy", 0.5, 0.0, 0.0));
  ASSERT_TRUE(seq.ok());
  held_sequence = *seq;
  absl::StatusOr<v1::TierPlan> plan;
  std::thread snapshot([&] { plan = a.Snapshot(*seq, 640, RampScores(40)); });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(kDeadlockBreaker));

  EXPECT_TRUE(b.Heartbeat().ok());
  v1::HeartbeatRequest beat = b.Signed(v1::HeartbeatRequest());
  beat.set_daemon_epoch(7);
  EXPECT_TRUE(core.ChannelHeartbeat(SelfPeer(), beat).ok());
  beat.set_session_secret("wrong");
  EXPECT_EQ(core.Heartbeat(beat).status().code(), absl::StatusCode::kPermissionDenied);
  // `lapsing` stays silent past its TTL while `b` keeps beating: its heartbeat finds the lease
  // expired, and nothing renews it afterwards.
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(b.Heartbeat().ok());
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(b.Heartbeat().ok());
  EXPECT_EQ(lapsing.Heartbeat().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lapsing.Heartbeat().code(), absl::StatusCode::kFailedPrecondition);
  release.Notify();
  snapshot.join();
  EXPECT_TRUE(released_in_time) << "a heartbeat waited for the snapshot under the core's lock";
  EXPECT_EQ(core.ReapExpired(), 2) << "`lapsing`, and `a`, silent for 11 s";
  EXPECT_TRUE(b.Heartbeat().ok());
  EXPECT_TRUE(core.CheckInvariants().ok()) << core.CheckInvariants();
}

}  // namespace
}  // namespace kvtier::daemon::testing
