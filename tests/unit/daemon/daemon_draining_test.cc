// Pool memory of ended sessions stays charged while any process holds it; identity
// finer than a uid for tickets; operators by configuration only; reloads that revoke sessions.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using testing::Env;
using testing::Policy;
using testing::PoolOf;
using testing::RampScores;
using testing::SimWorker;

// A process that only waits to be killed: a holder the test can end.
struct Sleeper {
  Sleeper() {
    pid = fork();
    if (pid == 0) {
      pause();
      _exit(0);
    }
  }
  ~Sleeper() { End(); }
  void End() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  edge::PeerCredentials peer() const { return {getuid(), getgid(), pid, {}}; }
  pid_t pid = -1;
};

// Fills the DDR pool (SmallOptions: 8 MiB, four 2 MiB extents) with one sequence of `w`.
void FillDdr(SimWorker& w) {
  auto seq = w.Open(0, Policy("hierarchy", 0.0, 0, 0));
  ASSERT_TRUE(seq.ok()) << seq.status();
  auto plan = w.Snapshot(*seq, 16 * 1100, RampScores(1100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(w.Ack(*plan, true).ok());
}

absl::StatusOr<std::vector<edge::UniqueFd>> Fetch(DaemonCore* core, SimWorker& w,
                                                  const edge::PeerCredentials& as) {
  v1::FetchExtents f = w.Signed(v1::FetchExtents());
  f.set_kind(v1::POOL_KIND_DDR);
  std::vector<edge::UniqueFd> fds;
  auto reply = core->FetchExtents(as, f, &fds);
  if (!reply.ok()) return reply.status();
  return fds;
}

// Sends sequence `seq` of `w` a snapshot of `pages` pages wanted in DDR; whether it was degraded.
bool Degraded(SimWorker& w, uint64_t seq, uint32_t pages) {
  auto plan = w.Snapshot(seq, uint64_t{16} * pages, RampScores(pages));
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return false;
  EXPECT_TRUE(w.Ack(*plan, true).ok());
  return plan->degraded();
}

absl::Status Close(DaemonCore* core, SimWorker& w) {
  return core->CloseWorker(w.Signed(v1::CloseWorkerRequest())).status();
}

TEST(DrainingTest, ExtentsOfAClosedSessionStayChargedUntilNoProcessHoldsThem) {
  Env env;
  SimWorker a(env.core.get());
  FillDdr(a);
  auto fds = Fetch(env.core.get(), a, testing::SelfPeer());
  ASSERT_TRUE(fds.ok());
  Sleeper holder;  // inherits the descriptors, as a worker's fork would
  fds->clear();
  const uint64_t reserved = PoolOf(env.core.get(), v1::POOL_KIND_DDR).reserved_bytes();
  ASSERT_EQ(reserved, 8ull << 20);
  ASSERT_TRUE(Close(env.core.get(), a).ok());
  v1::PoolStatus p = PoolOf(env.core.get(), v1::POOL_KIND_DDR);
  EXPECT_EQ(p.used_bytes(), 0u);
  EXPECT_EQ(p.reserved_bytes(), reserved);
  EXPECT_EQ(p.draining_bytes(), reserved);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  // Another worker finds the pool full: degraded, not over-committed.
  SimWorker b(env.core.get());
  auto seq = b.Open(0, Policy("hierarchy", 0.0, 0, 0));
  ASSERT_TRUE(seq.ok());
  EXPECT_TRUE(Degraded(b, *seq, 100));
  env.core->ReapExpired();
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).draining_bytes(), reserved);  // still held
  holder.End();
  env.core->ReapExpired();
  p = PoolOf(env.core.get(), v1::POOL_KIND_DDR);
  EXPECT_EQ(p.draining_bytes(), 0u);
  EXPECT_EQ(p.reserved_bytes(), 0u);
  EXPECT_FALSE(Degraded(b, *seq, 120));
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(DrainingTest, ExtentsNobodyHoldsGoBackAtOnce) {
  Env env;
  SimWorker a(env.core.get());
  FillDdr(a);
  {
    auto fds = Fetch(env.core.get(), a, testing::SelfPeer());  // taken and let go of
    ASSERT_TRUE(fds.ok());
  }
  ASSERT_TRUE(Close(env.core.get(), a).ok());
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).reserved_bytes(), 0u);
}

// A mass lease loss: the process registers again while it still maps its old pages (the client
// keeps them readable). Its new session gets no second copy of the pool (degraded, as any full
// pool), and the old extents come back as soon as it lets go of them, the process still alive.
TEST(DrainingTest, AWorkerRegisteringAgainWhileHoldingItsOldExtentsNeverDoublesThePool) {
  Env env;
  SimWorker a(env.core.get());
  FillDdr(a);
  edge::PeerCredentials unnamed = testing::SelfPeer();
  unnamed.pid = 0;  // another pid namespace, no pidfd: the kernel still says who holds memfds
  auto old = Fetch(env.core.get(), a, unnamed);
  ASSERT_TRUE(old.ok()) << old.status();
  env.clock.Advance(absl::Seconds(11));
  EXPECT_EQ(env.core->ReapExpired(), 1);
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).draining_bytes(), 8ull << 20);
  SimWorker again(env.core.get());
  auto seq = again.Open(0, Policy("hierarchy", 0.0, 0, 0));
  ASSERT_TRUE(seq.ok());
  EXPECT_TRUE(Degraded(again, *seq, 100));
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).reserved_bytes(), 8ull << 20);
  old->clear();
  env.core->ReapExpired();
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).draining_bytes(), 0u);
  EXPECT_FALSE(Degraded(again, *seq, 120));
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(IdentityTest, ProcessesOfOneUidHaveTicketsOfTheirOwn) {
  Env env;
  Sleeper other;
  absl::StatusOr<v1::ChannelReply> last;
  int granted = -1;
  do {
    last = env.core->Hello(testing::SelfPeer());
    ++granted;
  } while (last.ok() && granted < 1000);
  EXPECT_EQ(granted, 64);
  EXPECT_NE(last.status().message().find("per process"), std::string::npos) << last.status();
  EXPECT_TRUE(env.core->Hello(other.peer()).ok()) << "one process locked its uid out";
}

TEST(IdentityTest, OnlyTheDaemonsUidAndConfiguredOperatorsGetTheOperatorView) {
  CoreOptions o = testing::SmallOptions();
  const uint32_t tenant = getuid() == 0 ? 4242 : 0;
  o.security.allow_uids = {tenant, getuid()};
  Env env(o);
  EXPECT_TRUE(env.core->Hello(testing::SelfPeer())->operator_());
  EXPECT_FALSE(env.core->Hello({tenant, 0, 1, {}})->operator_()) << "an operator by default";
  o.security.operator_uids = {tenant};
  ASSERT_TRUE(env.core->Reload(o).ok());
  EXPECT_TRUE(env.core->Hello({tenant, 0, 1, {}})->operator_());
}

TEST(IdentityTest, AReloadRevokesTheSessionsOfAUidItNoLongerAllows) {
  CoreOptions o = testing::SmallOptions();
  o.security.allow_uids = {getuid()};
  Env env(o);
  SimWorker a(env.core.get());
  FillDdr(a);
  auto kept = Fetch(env.core.get(), a, testing::SelfPeer());
  ASSERT_TRUE(kept.ok());
  o.security.allow_uids = {getuid() + 1};
  std::vector<std::string> revoked;
  ASSERT_TRUE(env.core->Reload(o, &revoked).ok());
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_NE(revoked[0].find("security.allow_uids"), std::string::npos) << revoked[0];
  auto refused = a.Open(0, Policy("hierarchy", 0.0, 0, 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("revoked"), std::string::npos) << refused.status();
  EXPECT_EQ(Fetch(env.core.get(), a, testing::SelfPeer()).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a.Heartbeat().code(), absl::StatusCode::kPermissionDenied);
  // Its extents drain: this process still holds them.
  ASSERT_FALSE(kept->empty());
  EXPECT_EQ(PoolOf(env.core.get(), v1::POOL_KIND_DDR).draining_bytes(), 8ull << 20);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

}  // namespace
}  // namespace kvtier::daemon
