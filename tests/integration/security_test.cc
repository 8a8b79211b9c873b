// The trust boundary against a real kvtierd, real processes and real sockets: another worker's
// ids and a wrong secret change nothing; a worker of another user can reach no other worker's
// memory by any path it can name; the peer rules refuse by name; a short tmpfs degrades plans
// instead of crashing anyone.

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "kvtier/v1/kvtier.grpc.pb.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/fork_as.h"
#include "tests/integration/support/manual_session.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

constexpr uid_t kNobody = 65534;

SimWorkerOptions Sim(const std::string& address, uint64_t seed) {
  SimWorkerOptions o;
  o.address = address;
  o.seed = seed;
  return o;
}

TEST(SecurityTest, AnotherWorkersIdsOrAWrongSecretChangeNothingThroughTheDaemon) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto victim = SimWorker::Connect(Sim((*daemon)->address(), 1));
  auto attacker = SimWorker::Connect(Sim((*daemon)->address(), 2));
  ASSERT_TRUE(victim.ok() && attacker.ok());
  auto seq = (*victim)->Open();
  ASSERT_TRUE(seq.ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*victim)->Step(*seq, 160).ok());
  ASSERT_GT((*victim)->stats().verified_pages, 0u);
  auto before = (*victim)->client().GetStatus(true, true);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->sequence_list_size(), 1);
  const uint64_t victim_id = (*victim)->client().worker_id();
  const uint64_t victim_seq = before->sequence_list(0).sequence_id();

  // The attacker knows the ids (say it guessed them) and speaks gRPC directly.
  auto stub = v1::KvTier::NewStub(
      grpc::CreateChannel((*daemon)->address(), grpc::InsecureChannelCredentials()));
  int denied = 0, calls = 0;
  for (const std::string& secret : {std::string(), std::string(16, 'k')}) {
    auto check = [&](const grpc::Status& s) {
      ++calls;
      denied += s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    };
    {
      grpc::ClientContext ctx;
      v1::HeartbeatRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      r.set_daemon_epoch(before->daemon_epoch());
      v1::HeartbeatResponse out;
      check(stub->Heartbeat(&ctx, r, &out));
    }
    {
      grpc::ClientContext ctx;
      v1::OpenSequenceRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      v1::OpenSequenceResponse out;
      check(stub->OpenSequence(&ctx, r, &out));
    }
    {
      grpc::ClientContext ctx;
      v1::SubmitSnapshotRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      r.set_sequence_id(victim_seq);
      r.set_abandon_pending(true);
      v1::TierPlan out;
      check(stub->SubmitSnapshot(&ctx, r, &out));
    }
    {
      grpc::ClientContext ctx;
      v1::AckPlanRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      r.set_sequence_id(victim_seq);
      r.set_plan_version(before->sequence_list(0).plan_version());
      v1::AckPlanResponse out;
      check(stub->AckPlan(&ctx, r, &out));
    }
    {
      grpc::ClientContext ctx;
      v1::CloseSequenceRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      r.set_sequence_id(victim_seq);
      v1::CloseSequenceResponse out;
      check(stub->CloseSequence(&ctx, r, &out));
    }
    {
      grpc::ClientContext ctx;
      v1::CloseWorkerRequest r;
      r.set_worker_id(victim_id);
      r.set_session_secret(secret);
      v1::CloseWorkerResponse out;
      check(stub->CloseWorker(&ctx, r, &out));
    }
  }
  // With its own valid session, the attacker still cannot touch the victim's sequence.
  v1::SubmitSnapshotRequest own;
  own.set_sequence_id(victim_seq);
  auto stolen = (*attacker)->client().SubmitSnapshot(own);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_EQ((*attacker)->client().CloseSequence(victim_seq).code(),
            absl::StatusCode::kPermissionDenied);
  auto attacker_view = (*attacker)->client().GetStatus(true, true);
  ASSERT_TRUE(attacker_view.ok());
  EXPECT_EQ(attacker_view->sequence_list_size(), 0);  // its own: none
  for (const auto& w : attacker_view->worker_list()) EXPECT_NE(w.worker_id(), victim_id);
  EXPECT_EQ(denied, calls);

  auto after = (*victim)->client().GetStatus(true, true);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->worker_list(0).ddr_bytes(), before->worker_list(0).ddr_bytes());
  EXPECT_EQ(after->worker_list(0).compressed_bytes(), before->worker_list(0).compressed_bytes());
  EXPECT_EQ(after->sequence_list(0).plan_version(), before->sequence_list(0).plan_version());
  EXPECT_EQ((*victim)->client().worker_id(), victim_id);
  // The victim goes on as if nothing happened; every page it offloaded still holds its bytes.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*victim)->Step(*seq, 160).ok());
}

TEST(SecurityTest, AWorkerOfAnotherUserReachesNoOtherWorkersMemory) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a worker as another user";
  const std::string sock = SharedSocket("mem");
  auto daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string prefix = (*daemon)->shm_prefix().substr(1);
  const pid_t daemon_pid = (*daemon)->pid();
  Child child = ForkAs(kNobody, [&](int go, FILE* report) {
    int failures = 0;
    auto expect = [&](bool ok, const std::string& what) {
      std::fprintf(report, "%s %s\n", ok ? "ok" : "FAIL", what.c_str());
      failures += ok ? 0 : 1;
    };
    const std::vector<std::string> info = absl::StrSplit(ReadLine(go), ' ');
    if (info.size() != 2) return 91;
    const std::string victim_pid = info[0];
    const uint64_t victim_id = std::stoull(info[1]);
    // Its own session: the pool group may register.
    auto me = SimWorker::Connect(Sim("unix:" + sock, 3));
    expect(me.ok(), "registers as uid 65534 in the pool group");
    if (!me.ok()) return 92;
    // Nothing by name.
    bool named = false;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      named |= e.path().filename().string().find(prefix) != std::string::npos;
    }
    expect(!named, "no pool memory under /dev/shm");
    // No other process's descriptors or mappings.
    for (const std::string& pid : {std::to_string(daemon_pid), victim_pid}) {
      expect(opendir(("/proc/" + pid + "/fd").c_str()) == nullptr,
             "cannot list /proc/" + pid + "/fd");
      bool opened = false;
      for (int fd = 0; fd < 256; ++fd) {
        int f = open(("/proc/" + pid + "/fd/" + std::to_string(fd)).c_str(), O_RDWR);
        if (f >= 0) opened = true, close(f);
      }
      expect(!opened, "cannot open any /proc/" + pid + "/fd/N");
      expect(opendir(("/proc/" + pid + "/map_files").c_str()) == nullptr,
             "cannot list /proc/" + pid + "/map_files");
      expect(open(("/proc/" + pid + "/mem").c_str(), O_RDONLY) < 0,
             "cannot open /proc/" + pid + "/mem");
    }
    // The channel gives descriptors only to the session they belong to.
    std::string secret;  // a guess: its own secret is not the victim's
    v1::ChannelRequest steal;
    steal.mutable_fetch_extents()->set_worker_id(victim_id);
    steal.mutable_fetch_extents()->set_kind(v1::POOL_KIND_DDR);
    std::vector<edge::UniqueFd> fds;
    auto stolen = edge::ChannelCall(sock + ".mem", steal, &fds);
    expect(stolen.status().code() == absl::StatusCode::kPermissionDenied && fds.empty(),
           "the channel refuses the victim's extents: " + std::string(stolen.status().message()));
    // Its own pool header is sealed: not even its owner can write it.
    v1::ChannelRequest mine;
    mine.mutable_fetch_extents()->set_worker_id((*me)->client().worker_id());
    mine.mutable_fetch_extents()->set_kind(v1::POOL_KIND_DDR);
    expect(!edge::ChannelCall(sock + ".mem", mine, &fds).ok(),
           "its own extents need its secret too");
    return failures == 0 ? 0 : 1;
  });
  ASSERT_GT(child.pid, 0);
  // The victim (this process, root) offloads pages into its own extents.
  auto victim = SimWorker::Connect(Sim((*daemon)->address(), 4));
  ASSERT_TRUE(victim.ok()) << victim.status();
  auto seq = (*victim)->Open();
  ASSERT_TRUE(seq.ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*victim)->Step(*seq, 160).ok());
  ASSERT_GT((*victim)->client().pool(v1::POOL_KIND_DDR)->mapped_extents(), 0u);
  const std::string info = absl::StrCat(getpid(), " ", (*victim)->client().worker_id(), "\n");
  ASSERT_EQ(write(child.go_write, info.data(), info.size()), static_cast<ssize_t>(info.size()));
  std::string report;
  EXPECT_EQ(Wait(child, &report), 0) << report;
  std::printf("what the other user's worker tried:\n%s", report.c_str());
  EXPECT_EQ(report.find("FAIL"), std::string::npos) << report;
  EXPECT_GE(std::count(report.begin(), report.end(), '\n'), 10) << report;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*victim)->Step(*seq, 160).ok());
}

TEST(SecurityTest, TheSealedHeaderCannotBeWrittenByTheWorkerItBelongsTo) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Registered by hand to keep the secret (the library keeps it private).
  auto session = RegisterByHand((*daemon)->address());
  ASSERT_TRUE(session.ok()) << session.status();
  const v1::RegisterWorkerResponse& reg = session->reg;
  v1::ChannelRequest fetch;
  fetch.mutable_fetch_extents()->set_worker_id(reg.worker_id());
  fetch.mutable_fetch_extents()->set_session_secret(reg.session_secret());
  fetch.mutable_fetch_extents()->set_kind(v1::POOL_KIND_DDR);
  std::vector<edge::UniqueFd> fds;
  auto reply = edge::ChannelCall((*daemon)->socket_path() + ".mem", fetch, &fds);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_GE(fds.size(), 1u);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0), MAP_FAILED);
  EXPECT_LT(pwrite(fds[0].get(), "x", 1, 0), 0);
  EXPECT_NE(ftruncate(fds[0].get(), 0), 0);
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fds[0].get(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(static_cast<const uint32_t*>(ro)[0], 0x5054564Bu);
  munmap(ro, 4096);
  // Bad input on the channel: a clear error, and the daemon keeps serving.
  v1::ChannelRequest empty;
  auto refused = edge::ChannelCall((*daemon)->socket_path() + ".mem", empty, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  fetch.mutable_fetch_extents()->set_kind(v1::POOL_KIND_UNSPECIFIED);
  auto kind = edge::ChannelCall((*daemon)->socket_path() + ".mem", fetch, nullptr);
  EXPECT_NE(kind.status().message().find("kind"), absl::string_view::npos) << kind.status();
  fetch.mutable_fetch_extents()->set_kind(v1::POOL_KIND_DDR);
  fetch.mutable_fetch_extents()->set_first_extent(1000);
  auto past = edge::ChannelCall((*daemon)->socket_path() + ".mem", fetch, nullptr);
  EXPECT_NE(past.status().message().find("first_extent"), absl::string_view::npos);
  EXPECT_TRUE(ChannelHello((*daemon)->address()).ok());
}

TEST(SecurityTest, AClientThatConnectsAndSaysNothingHoldsUpNobody) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = (*daemon)->socket_path() + ".mem";
  std::memcpy(addr.sun_path, path.data(), path.size());
  edge::UniqueFd stuck(socket(AF_UNIX, SOCK_SEQPACKET, 0));
  ASSERT_EQ(connect(stuck.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  absl::SleepFor(absl::Milliseconds(50));  // a serving thread now waits on it
  for (int i = 0; i < 3; ++i) {
    auto hello = ChannelHello((*daemon)->address());
    ASSERT_TRUE(hello.ok()) << hello.status();
  }
  // Served while the silent client still holds its connection (no reply to it yet).
  pollfd p{stuck.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the hellos waited for the silent client to time out";
  // It is dropped with an error after the channel's timeout.
  EXPECT_EQ(poll(&p, 1, 2000), 1);
}

TEST(SecurityTest, APeerOutsideTheAllowedSetIsRefusedNamingTheRule) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a worker as another user";
  const std::string sock = SharedSocket("peer");
  auto daemon =
      DaemonProcess::Start({.config_text = "[security]\nallow_uids = [0]\n", .socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Child child = ForkAs(kNobody, [&](int, FILE* report) {
    auto w = SimWorker::Connect(Sim("unix:" + sock, 5));
    const std::string msg = w.ok() ? "registered" : std::string(w.status().message());
    std::fprintf(report, "%s\n", msg.c_str());
    return !w.ok() && w.status().code() == absl::StatusCode::kPermissionDenied ? 0 : 1;
  });
  std::string report;
  EXPECT_EQ(Wait(child, &report), 0) << report;
  EXPECT_NE(report.find("uid 65534"), std::string::npos) << report;
  EXPECT_NE(report.find("security.allow_uids [0]"), std::string::npos) << report;
  // Root still may.
  EXPECT_TRUE(SimWorker::Connect(Sim("unix:" + sock, 6)).ok());
}

TEST(SecurityTest, KvtierctlListsWorkersForOperatorsAndNodeTotalsForOthers) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run kvtierctl as another user";
  const std::string sock = SharedSocket("ctl");
  auto daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Child child = ForkAs(kNobody, [&](int go, FILE* report) {
    ReadLine(go);  // wait until the worker exists
    RunResult r = RunProgram({BuiltProgram("kvtierctl"), "--socket", sock, "workers"});
    std::fprintf(report, "%s", r.output.c_str());
    return r.exit_code;
  });
  auto w = SimWorker::Connect(Sim("unix:" + sock, 8));
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string id = std::to_string((*w)->client().worker_id());
  RunResult op = RunProgram({BuiltProgram("kvtierctl"), "--socket", sock, "workers"});
  EXPECT_EQ(op.exit_code, 0) << op.output;
  EXPECT_NE(op.output.find(id), std::string::npos) << op.output;
  ASSERT_EQ(write(child.go_write, "go\n", 3), 3);
  std::string other;
  EXPECT_EQ(Wait(child, &other), 0) << other;
  EXPECT_EQ(other.find(id), std::string::npos) << other;
  EXPECT_NE(other.find("node totals only"), std::string::npos) << other;
  EXPECT_NE(other.find("uid 65534 is not in security.operator_uids"), std::string::npos) << other;
}

// Files in an extent directory cannot be sealed (tmpfs seals only memfds): a worker could grow
// its own extent and fill the filesystem for every other worker. The setting is refused at start,
// naming it and why.
TEST(SecurityTest, AnExtentDirectoryIsRefusedAtStartBecauseItsExtentsCannotBeSealed) {
  const std::string dir = ::testing::TempDir() + "/kvtier-extents-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto refused = DaemonProcess::Start({.config_text = "extent_dir = \"" + dir + "\"\n"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pools.extent_dir = \"" + dir + "\" is refused"),
            absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("cannot be sealed"), absl::string_view::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::testing
