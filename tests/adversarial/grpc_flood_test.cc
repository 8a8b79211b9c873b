// Floods of the gRPC socket against a real kvtierd (issue #31, rows 4, 5 and 15): a flooder
// whose process holds a live session, one behind a pid namespace, one that holds many
// unfinished large messages, and a worker that reads every answer at its own pace. The daemon
// drops the flooders, keeps its memory bounded, serves every other worker, and never drops the
// worker that reads. The test process never speaks gRPC itself (it forks): it reads the daemon
// through /metrics, /proc and kvtierctl.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.pb.h"
#include "tests/adversarial/attack_support.h"
#include "tests/integration/support/h2_flood.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"
#include "tests/support/sanitizers.h"

namespace kvtier::testing {
namespace {

// Leases outlive every test, so a session never lapses by itself.
constexpr char kConfig[] =
    "[server]\nreap_interval_ms = 50\nunread_timeout_ms = 500\n"
    "[leases]\nttl_ms = 30000\nheartbeat_ms = 500\n";

// A child that holds a live session (heartbeats on the memory channel: no call on its gRPC
// connection) and then runs `then`.
void WithSession(const std::string& address, const std::function<void()>& then) {
  auto worker = SimWorker::Connect({.address = address});
  if (!worker.ok()) {
    std::fprintf(stderr, "session: %s\n", worker.status().ToString().c_str());
    _exit(3);
  }
  then();
}

// A paced flood of GetStatus (64 every 20 ms) that never reads, reconnecting when dropped; over
// TCP when `tcp_port` is set.
void Flood(const std::string& socket_path, int report_fd, int tcp_port = 0) {
  FloodOptions flood{.socket_path = socket_path,
                     .tcp_port = tcp_port,
                     .message = v1::GetStatusRequest().SerializeAsString(),
                     .reconnect = true,
                     .pause = absl::Milliseconds(20),
                     .progress_fd = report_fd};
  (void)FloodWithoutReading(flood);
}

struct Figures {
  uint64_t rss0 = 0, rss_max = 0;
  FloodProgress flood;
};

// Samples the daemon's RSS for `how_long` while `kids` run; the flood's figures from child `i`.
Figures Watch(const AttackDaemon& d, Children& kids, int flooder, absl::Duration how_long) {
  Figures f;
  f.rss0 = f.rss_max = ResidentBytes(d.pid);
  for (const absl::Time t0 = absl::Now(); absl::Now() - t0 < how_long;) {
    f.rss_max = std::max(f.rss_max, ResidentBytes(d.pid));
    absl::SleepFor(absl::Milliseconds(50));
  }
  f.flood = kids.Last<FloodProgress>(flooder);
  return f;
}

void Print(const char* what, const Figures& f) {
  std::printf("%s: %llu requests over %llu connections; daemon RSS %.1f MiB before, max %.1f\n",
              what, static_cast<unsigned long long>(f.flood.streams),
              static_cast<unsigned long long>(f.flood.connections), f.rss0 / 1048576.0,
              f.rss_max / 1048576.0);
}

// Row 4: the guard used to exempt a connection whose peer *process* held a session that had
// made no call lately, so a worker's process could flood from a second connection for ever
// (880 MiB in 20 s). Now calls are counted per connection: the flooding one is dropped.
TEST(GrpcFloodTest, AFlooderHoldingALiveSessionIsDroppedAndMemoryStaysBounded) {
  AttackDaemon d = StartAttackDaemon(kConfig);
  ASSERT_NE(d.process, nullptr);
  Children kids;
  const int worker = kids.Spawn([&](int fd) { RunSimWorkerProcess(d.process->address(), 41, fd); });
  const int flooder = kids.Spawn([&](int fd) {
    WithSession(d.process->address(), [&] { Flood(d.process->socket_path(), fd); });
  });
  const Figures f = Watch(d, kids, flooder, absl::Seconds(10));
  Print("flood from a process with a session", f);
  EXPECT_FALSE(kids.Exited(flooder)) << "the flooder could not start: " << d.process->Log();
  EXPECT_GE(f.flood.streams, kUnderThreadSanitizer ? 1'000u : 10'000u) << "no flood";
  EXPECT_GE(f.flood.connections, 3u) << "the flooding connection was never dropped";
  EXPECT_LE(f.rss_max, f.rss0 + (160ull << 20)) << "daemon memory grew with the flood";
  EXPECT_GE(kids.Last<SimProgress>(worker).steps, 20u) << "the worker beside it was starved";
  EXPECT_FALSE(kids.Exited(worker));
  EXPECT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), nullptr));
}

// Row 4: in a pid namespace of its own (a DaemonSet without hostPID) the daemon sees every peer
// as pid 0, and the guard, keyed by pid, took a sessionless flooder for the idle worker whose
// pid was also 0 (667 MiB in 15 s). The daemon runs here under unshare --pid.
TEST(GrpcFloodTest, AFlooderSeenAsPidZeroIsDroppedAndMemoryStaysBounded) {
  AttackDaemon d =
      StartAttackDaemon(kConfig, {"/usr/bin/unshare", "--pid", "--fork", "--kill-child"});
  ASSERT_NE(d.process, nullptr);
  ASSERT_GT(d.pid, 0) << "no kvtierd under unshare";
  Children kids;
  // An idle worker with a live session: pid 0 to the daemon, no gRPC call after registering.
  kids.Spawn([&](int) {
    WithSession(d.process->address(), [] {
      for (;;) pause();  // the session lives while the child does
    });
  });
  absl::SleepFor(absl::Seconds(1));
  const int flooder = kids.Spawn([&](int fd) { Flood(d.process->socket_path(), fd); });
  const Figures f = Watch(d, kids, flooder, absl::Seconds(10));
  Print("flood seen as pid 0", f);
  EXPECT_GE(f.flood.streams, kUnderThreadSanitizer ? 1'000u : 10'000u) << "no flood";
  EXPECT_GE(f.flood.connections, 3u) << "the flooding connection was never dropped";
  EXPECT_LE(f.rss_max, f.rss0 + (160ull << 20)) << "daemon memory grew with the flood";
  std::string out;
  EXPECT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), &out)) << out;
  EXPECT_EQ(d.process->Log().find("stopped reading: pid 0 "), std::string::npos)
      << "a drop named pid 0 as if it were an identity: " << d.process->Log();
}

// Row 5: with server.tcp set, nothing looked at TCP connections: the same flood over TCP grew
// the daemon without bound (623 MiB in 15 s). The guard samples TCP connections too, the bytes
// the peer acknowledged standing for its reads.
TEST(GrpcFloodTest, AFlooderOverTcpIsDroppedAndMemoryStaysBounded) {
  const int port = *FreeLoopbackPort();
  AttackDaemon d = StartAttackDaemon(
      absl::StrCat("[server]\ntcp = \"127.0.0.1:", port, "\"\n", std::string(kConfig).substr(9)));
  ASSERT_NE(d.process, nullptr);
  Children kids;
  const int flooder =
      kids.Spawn([&](int fd) { Flood(d.process->socket_path(), fd, /*tcp_port=*/port); });
  const Figures f = Watch(d, kids, flooder, absl::Seconds(10));
  Print("flood over TCP", f);
  EXPECT_GE(f.flood.streams, kUnderThreadSanitizer ? 1'000u : 10'000u) << "no flood";
  EXPECT_GE(f.flood.connections, 3u) << "the flooding connection was never dropped";
  EXPECT_LE(f.rss_max, f.rss0 + (160ull << 20)) << "daemon memory grew with the flood";
  std::string out;
  EXPECT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), &out)) << out;
}

// Row 5: a peer that reads everything and opens stream after stream, each an unfinished ~10 MB
// message, made gRPC buffer them all (2.25 GB from one connection in 13 s). Streams per
// connection and gRPC's memory are bounded now.
TEST(GrpcFloodTest, ManyUnfinishedLargeMessagesOnOneConnectionStayBounded) {
  AttackDaemon d = StartAttackDaemon(kConfig);
  ASSERT_NE(d.process, nullptr);
  Children kids;
  const int holder = kids.Spawn([&](int fd) {
    (void)HoldUnfinishedMessages({.socket_path = d.process->socket_path(),
                                  .streams = 256,
                                  .duration = absl::Seconds(10),
                                  .progress_fd = fd});
  });
  uint64_t rss0 = ResidentBytes(d.pid), rss_max = rss0;
  for (const absl::Time t0 = absl::Now(); absl::Now() - t0 < absl::Seconds(10);) {
    rss_max = std::max(rss_max, ResidentBytes(d.pid));
    absl::SleepFor(absl::Milliseconds(50));
  }
  const HoldProgress p = kids.Last<HoldProgress>(holder);
  std::printf(
      "unfinished messages: %llu streams opened, %llu refused, %.1f MiB sent, closed %llu; "
      "daemon RSS %.1f MiB before, max %.1f\n",
      static_cast<unsigned long long>(p.streams), static_cast<unsigned long long>(p.refused),
      p.bytes / 1048576.0, static_cast<unsigned long long>(p.closed), rss0 / 1048576.0,
      rss_max / 1048576.0);
  EXPECT_GE(p.streams, 16u) << "the attack did not happen";
  EXPECT_LE(rss_max, rss0 + (400ull << 20)) << "gRPC buffered the unfinished messages";
  std::string out;
  EXPECT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), &out)) << out;
}

// Row 15: a client that calls every 250 ms and reads every answer, but whose connection shows
// the same 17 bytes unread at each of the guard's samples (the answer to the PING it sent after
// its last answer, as gRPC's client does to measure the link, waits for its next call). The
// guard counted progress only when the unread count fell, so it dropped this connection; it
// counts the peer's reads now.
TEST(GrpcFloodTest, AClientThatReadsEveryAnswerIsNeverDropped) {
  AttackDaemon d = StartAttackDaemon(kConfig);
  ASSERT_NE(d.process, nullptr);
  Children kids;
  constexpr int kCalls = 16;
  const int client = kids.Spawn([&](int fd) {
    (void)CallEveryIntervalReadingEachAnswer({.socket_path = d.process->socket_path(),
                                              .message = v1::GetStatusRequest().SerializeAsString(),
                                              .calls = kCalls,
                                              .progress_fd = fd});
    (void)!write(fd, "done\0\0\0\0", 8);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  uint64_t answered = 0;
  while (absl::Now() < deadline) {
    const uint64_t last = kids.Last<uint64_t>(client);
    if (last == 0x656e6f64) break;  // "done"
    answered = last;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("a client reading every answer: %llu of %d calls answered\n",
              static_cast<unsigned long long>(answered), kCalls);
  EXPECT_EQ(answered, static_cast<uint64_t>(kCalls)) << d.process->Log();
  EXPECT_EQ(
      ScrapeMetric(d.metrics_port, "kvtier_connections_dropped_total{reason=\"grpc_unread\"}"), 0)
      << d.process->Log();
}

}  // namespace
}  // namespace kvtier::testing
