// Accounting and identity attacks on a real kvtierd (issue #31, rows 3, 11 and 13), from real
// processes over real sockets, bounded in time:
//  - a process that registers, takes extents, keeps their descriptors and closes, over and over,
//    must not hold more memory than the budget the daemon reports charged; other workers find the
//    pool full (degraded plans) until that process exits, then the budget comes back;
//  - processes of one uid (root worker pods share uid 0) each have their own hello tickets;
//  - a reload that removes a uid from [security] ends that uid's live sessions at once.

#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/manual_session.h"
#include "tests/integration/support/pool_memory_figures.h"

namespace kvtier::testing {
namespace {

// Children use gRPC; the parent must not have touched it when it forks. Tests whose parent calls
// gRPC come last (gtest runs them in the order of this file).
constexpr int kCycles = 12;
constexpr uint32_t kPageBytes = 16384;  // SmallRegistration's T1 slot

// A child process running `body` (as `uid` when set), reporting lines on a pipe; it waits for
// the parent's "go" (or the pipe's end) where the body reads `go`. Forked before this process
// touches gRPC.
struct Child {
  pid_t pid = -1;
  int go = -1;     // parent writes
  FILE* report{};  // parent reads
};

Child Fork(std::function<int(FILE* report, int go)> body, int uid = -1) {
  int go[2], rep[2];
  if (pipe(go) != 0 || pipe(rep) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(go[1]);
    close(rep[0]);
    FILE* report = fdopen(rep[1], "w");
    setvbuf(report, nullptr, _IOLBF, 0);
    if (uid >= 0 && (setgroups(0, nullptr) != 0 || setgid(0) != 0 || setuid(uid) != 0)) {
      std::fprintf(report, "FAIL cannot become uid %d\n", uid);
      _exit(90);
    }
    _exit(body(report, go[0]));
  }
  close(go[0]);
  close(rep[1]);
  return {pid, go[1], fdopen(rep[0], "r")};
}

// The child's next report line ("" at its end).
std::string Line(const Child& c) {
  char buf[4096];
  if (c.report == nullptr || std::fgets(buf, sizeof(buf), c.report) == nullptr) return "";
  std::string line(buf);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}

void Go(const Child& c) { (void)!write(c.go, "g", 1); }
void WaitGo(int go) {
  char c;
  (void)!read(go, &c, 1);
}

// Ends the child (SIGKILL if it does not exit by itself within 10 s); its exit code.
int Finish(Child& c) {
  close(c.go);
  int status = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      if (c.report != nullptr) std::fclose(c.report);
      return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(c.pid, SIGKILL);
  waitpid(c.pid, &status, 0);
  if (c.report != nullptr) std::fclose(c.report);
  return 137;
}

std::string Mem(const DaemonProcess& d) { return d.socket_path() + ".mem"; }

absl::Status Check(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Opens a sequence and sends a prefill snapshot of `pages` pages, everything but the protected
// pages wanted in DDR (hierarchy, hbm_ratio 0): the daemon grants DDR slots, making extents.
absl::StatusOr<v1::TierPlan> FillDdr(const ManualSession& s, uint32_t pages) {
  v1::OpenSequenceRequest open;
  open.set_worker_id(s.reg.worker_id());
  open.set_session_secret(s.reg.session_secret());
  open.set_prompt_tokens(16);
  open.mutable_policy()->set_name("hierarchy");
  v1::OpenSequenceResponse seq;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (absl::Status st = Check(s.stub->OpenSequence(&ctx, open, &seq)); !st.ok()) return st;
  }
  v1::SubmitSnapshotRequest snap;
  snap.set_worker_id(s.reg.worker_id());
  snap.set_session_secret(s.reg.session_secret());
  snap.set_sequence_id(seq.sequence_id());
  snap.set_length(uint64_t{pages} * 16);
  snap.set_num_pages(pages);
  for (uint32_t i = 0; i < pages; ++i) snap.add_page_scores(1.0f + i % 7);
  snap.set_current_tiers(std::string(pages, '\0'));
  v1::TierPlan plan;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (absl::Status st = Check(s.stub->SubmitSnapshot(&ctx, snap, &plan)); !st.ok()) return st;
  return plan;
}

// The session's DDR extents, as descriptors of this process.
absl::StatusOr<std::vector<edge::UniqueFd>> FetchDdr(const std::string& channel,
                                                     const ManualSession& s) {
  v1::ChannelRequest r;
  r.mutable_fetch_extents()->set_worker_id(s.reg.worker_id());
  r.mutable_fetch_extents()->set_session_secret(s.reg.session_secret());
  r.mutable_fetch_extents()->set_kind(v1::POOL_KIND_DDR);
  std::vector<edge::UniqueFd> fds;
  absl::StatusOr<v1::ChannelReply> reply = edge::ChannelCall(channel, r, &fds);
  if (!reply.ok()) return reply.status();
  return fds;
}

absl::Status CloseWorker(const ManualSession& s) {
  v1::CloseWorkerRequest r;
  r.set_worker_id(s.reg.worker_id());
  r.set_session_secret(s.reg.session_secret());
  v1::CloseWorkerResponse out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return Check(s.stub->CloseWorker(&ctx, r, &out));
}

v1::PoolStatus DdrStatus(const std::string& address) {
  auto stub = v1::KvTier::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatusRequest r;
  v1::GetStatusResponse out;
  if (!stub->GetStatus(&ctx, r, &out).ok()) return {};
  for (const v1::PoolStatus& p : out.pools()) {
    if (p.kind() == v1::POOL_KIND_DDR) return p;
  }
  return {};
}

// Row 11: processes of one uid (root pods all are uid 0) do not share one ticket budget: one that
// spends its tickets does not lock out another.
TEST(IdentityAttackTest, OneProcessSpendingItsTicketsLocksOutNoOtherProcessOfItsUid) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string channel = Mem(**daemon);
  v1::ChannelRequest hello;
  hello.mutable_hello();
  Child hoarder = Fork([&](FILE* report, int go) {
    int granted = 0;
    absl::Status refused;
    for (int i = 0; i < 5000 && refused.ok(); ++i) {
      absl::StatusOr<v1::ChannelReply> r = edge::ChannelCall(channel, hello, nullptr);
      if (r.ok()) ++granted;
      refused = r.status();
    }
    std::fprintf(report, "granted %d; %s\n", granted, refused.ToString().c_str());
    WaitGo(go);
    return 0;
  });
  const std::string spent = Line(hoarder);
  std::printf("hoarder: %s\n", spent.c_str());
  EXPECT_NE(spent.find("RESOURCE_EXHAUSTED"), std::string::npos) << spent;
  absl::StatusOr<v1::ChannelReply> mine = edge::ChannelCall(channel, hello, nullptr);
  EXPECT_TRUE(mine.ok()) << "another process of uid " << getuid() << ": " << mine.status();
  EXPECT_EQ(Finish(hoarder), 0);
}

// Row 13: a SIGHUP that removes a uid from [security] ends its live sessions: its requests are
// PERMISSION_DENIED naming the rule, and the daemon logs the revocation.
TEST(IdentityAttackTest, AReloadThatRemovesAUidRevokesItsLiveSessions) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (a child that becomes another uid)";
  constexpr int kTenant = 65534;
  const std::string dir = ::testing::TempDir() + "/kvtier-revoke-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  const std::string allowed = absl::StrCat("[security]\nallow_uids = [0, ", kTenant, "]\n");
  auto daemon =
      DaemonProcess::Start({.config_text = allowed, .socket_path = dir + "/kvtierd.sock"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address(), channel = Mem(**daemon);
  Child tenant = Fork(
      [&](FILE* report, int go) {
        absl::StatusOr<ManualSession> s = RegisterByHand(address);
        absl::StatusOr<v1::TierPlan> plan = s.ok() ? FillDdr(*s, 300) : s.status();
        if (!plan.ok()) {
          std::fprintf(report, "FAIL %s\n", plan.status().ToString().c_str());
          return 1;
        }
        std::fprintf(report, "registered\n");
        WaitGo(go);
        absl::StatusOr<v1::TierPlan> again = FillDdr(*s, 300);
        absl::StatusOr<std::vector<edge::UniqueFd>> fds = FetchDdr(channel, *s);
        std::fprintf(report, "open: %s\n", again.status().ToString().c_str());
        std::fprintf(report, "fetch: %s\n", fds.status().ToString().c_str());
        return 0;
      },
      kTenant);
  ASSERT_EQ(Line(tenant), "registered");
  ASSERT_TRUE((*daemon)->RewriteConfig("[security]\nallow_uids = [0]\n").ok());
  ASSERT_TRUE((*daemon)->Signal(SIGHUP).ok());
  ASSERT_TRUE((*daemon)->WaitForLog("SIGHUP: reloaded", absl::Seconds(5))) << (*daemon)->Log();
  EXPECT_NE((*daemon)->Log().find("session revoked"), std::string::npos) << (*daemon)->Log();
  Go(tenant);
  const std::string open = Line(tenant), fetch = Line(tenant);
  std::printf("after the reload: %s; %s\n", open.c_str(), fetch.c_str());
  for (const std::string& line : {open, fetch}) {
    EXPECT_NE(line.find("PERMISSION_DENIED"), std::string::npos) << line;
    EXPECT_NE(line.find("security.allow_uids [0]"), std::string::npos) << line;
  }
  EXPECT_EQ(Finish(tenant), 0);
}

// Row 3: register, take extents, keep their descriptors, close; twelve times from one process.
// Whatever that process holds stays charged to the budget; the real footprint of the DDR pool
// (the kernel's: memfd pages held by the daemon and the attacker) never exceeds the budget; a
// second worker's grants are degraded meanwhile; once the attacker exits the budget comes back.
TEST(IdentityAttackTest, KeptExtentDescriptorsStayChargedUntilTheHolderExits) {
  auto cgroup = ShmemCgroup::Create(absl::StrCat("kvtier-identity-", getpid()));
  if (cgroup.ok() && !(*cgroup)->Enter().ok()) cgroup = absl::UnavailableError("cannot enter");
  // 16 MiB of DDR in 2 MiB extents: 8 extents, 1024 slots of 16 KiB.
  auto daemon = DaemonProcess::Start(
      {.config_text = "[server]\nreap_interval_ms = 100\n", .ddr_mib = 16, .compressed_mib = 8});
  if (cgroup.ok()) {
    ASSERT_TRUE((*cgroup)->Leave().ok());
  }
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const uint64_t budget = 16ull << 20;
  const std::string address = (*daemon)->address(), channel = Mem(**daemon);
  const std::string ddr = absl::StrCat((*daemon)->shm_prefix().substr(1), "-ddr");

  Child attacker = Fork([&](FILE* report, int go) {
    std::vector<edge::UniqueFd> kept;
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      absl::StatusOr<ManualSession> s = RegisterByHand(address);
      absl::StatusOr<v1::TierPlan> plan =
          s.ok() ? FillDdr(*s, 1100) : absl::StatusOr<v1::TierPlan>(s.status());
      absl::StatusOr<std::vector<edge::UniqueFd>> fds =
          plan.ok() ? FetchDdr(channel, *s) : plan.status();
      if (!fds.ok()) {
        std::fprintf(report, "FAIL cycle %d: %s\n", cycle, fds.status().ToString().c_str());
        return 1;
      }
      for (auto& fd : *fds) kept.push_back(std::move(fd));
      if (absl::Status st = CloseWorker(*s); !st.ok()) {
        std::fprintf(report, "FAIL close %d: %s\n", cycle, st.ToString().c_str());
        return 1;
      }
    }
    std::fprintf(report, "held %zu descriptors\n", kept.size());
    WaitGo(go);
    return 0;
  });
  const std::string held_line = Line(attacker);
  ASSERT_EQ(held_line.rfind("held ", 0), 0u) << held_line;

  // The daemon's books against the kernel's, while the attacker holds what it kept.
  const v1::PoolStatus books = DdrStatus(address);
  const uint64_t attacker_holds = MemfdBytesHeld({attacker.pid}, ddr);
  const uint64_t footprint = MemfdBytesHeld({attacker.pid, (*daemon)->pid()}, ddr);
  const uint64_t shmem = cgroup.ok() ? (*cgroup)->ShmemBytes() : 0;
  std::printf(
      "after %d cycles: attacker holds %llu MiB of DDR extents (kernel), DDR footprint %llu MiB, "
      "daemon cgroup shmem %s; daemon: used %llu, reserved %llu, draining %llu MiB; budget %llu "
      "MiB\n",
      kCycles, (unsigned long long)(attacker_holds >> 20), (unsigned long long)(footprint >> 20),
      cgroup.ok() ? absl::StrCat(shmem >> 20, " MiB").c_str() : "n/a",
      (unsigned long long)(books.used_bytes() >> 20),
      (unsigned long long)(books.reserved_bytes() >> 20),
      (unsigned long long)(books.draining_bytes() >> 20), (unsigned long long)(budget >> 20));
  EXPECT_GT(attacker_holds, 0u);
  EXPECT_LE(footprint, budget) << "the pool's real memory exceeds its budget";
  EXPECT_GE(books.reserved_bytes(), attacker_holds) << "memory a process holds is not charged";
  EXPECT_GE(books.draining_bytes(), attacker_holds) << "held memory of ended sessions unreported";
  if (cgroup.ok()) {
    // Every page the daemon allocated and is still alive: the budgets (DDR + compressed) at most,
    // plus the one-page headers.
    EXPECT_LE(shmem, budget + (8ull << 20) + (1ull << 20)) << "kernel shmem beyond the budgets";
  }

  // Another worker (another process): degraded for lack of DDR, never over-committed.
  absl::StatusOr<ManualSession> victim = RegisterByHand(address);
  ASSERT_TRUE(victim.ok()) << victim.status();
  absl::StatusOr<v1::TierPlan> starved = FillDdr(*victim, 300);
  ASSERT_TRUE(starved.ok()) << starved.status();
  EXPECT_TRUE(starved->degraded()) << "granted DDR the attacker still holds";
  EXPECT_LE(MemfdBytesHeld({attacker.pid, (*daemon)->pid()}, ddr), budget);

  // The holder exits: the reaper sees its pidfd and the budget comes back.
  ASSERT_EQ(Finish(attacker), 0);
  v1::PoolStatus after;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    after = DdrStatus(address);
    if (after.draining_bytes() == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(after.draining_bytes(), 0u);
  absl::StatusOr<v1::TierPlan> fed = FillDdr(*victim, 300);
  ASSERT_TRUE(fed.ok()) << fed.status();
  EXPECT_FALSE(fed->degraded()) << fed->degraded_reason();
  std::printf("after the attacker exited: reserved %llu MiB, draining %llu; victim degraded: %d\n",
              (unsigned long long)(after.reserved_bytes() >> 20),
              (unsigned long long)after.draining_bytes(), fed->degraded());
  (*daemon).reset();
}

}  // namespace
}  // namespace kvtier::testing
