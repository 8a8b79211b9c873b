// Monitors that see what workers see (issue #31, row 14 and item 9): `kvtierctl health` (the
// k8s probes) and kvtierd's systemd watchdog must go red when workers are cut off, not only when
// the core stops answering. A wedged channel and a deaf gRPC listener are what a worker meets at
// the socket paths: here the daemon's sockets are moved aside and something that accepts and
// never answers takes their place (no other fix is needed to wedge it so), then moved back.

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"

namespace kvtier {
namespace {

using testing::BuiltProgram;
using testing::DaemonProcess;
using testing::RunProgram;
using testing::RunResult;

edge::UniqueFd Bound(const std::string& path, int type) {
  edge::UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  return fd;
}

// Moves the daemon's socket at `path` aside and puts a listener there that accepts (the kernel's
// backlog does) and never answers; the destructor puts the daemon's back.
class Impostor {
 public:
  Impostor(std::string path, int type) : path_(std::move(path)) {
    EXPECT_EQ(std::rename(path_.c_str(), (path_ + ".real").c_str()), 0) << path_;
    fd_ = Bound(path_, type);
    EXPECT_EQ(listen(fd_.get(), 128), 0);
  }
  ~Impostor() {
    fd_.Reset();
    unlink(path_.c_str());
    std::rename((path_ + ".real").c_str(), path_.c_str());
  }

 private:
  std::string path_;
  edge::UniqueFd fd_;
};

RunResult Health(const DaemonProcess& d, const std::string& timeout = "0.5",
                 const std::string& extra = "") {
  std::vector<std::string> argv = {
      BuiltProgram("kvtierctl"), "--socket", d.socket_path(), "health", "--timeout", timeout};
  if (!extra.empty()) argv.push_back(extra);
  return RunProgram(argv, absl::Seconds(20));
}

TEST(HealthMonitorTest, KvtierctlHealthPassesEveryCheckOnAHealthyDaemonAndCountsNoError) {
  absl::StatusOr<int> port = testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto d = DaemonProcess::Start({.metrics_address = absl::StrCat("127.0.0.1:", *port)});
  ASSERT_TRUE(d.ok()) << d.status();
  RunResult r = Health(**d, "2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* check : {"channel-hello", "channel-heartbeat", "grpc-status"}) {
    EXPECT_TRUE(absl::StrContains(r.output, absl::StrCat("ok   ", check))) << r.output;
  }
  RunResult json = Health(**d, "2", "--json");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(absl::StrContains(json.output, "\"healthy\": true")) << json.output;
  // The socket from the environment, as a worker's pod would give it.
  RunResult env = RunProgram({BuiltProgram("kvtierctl"), "health"}, absl::Seconds(20),
                             {absl::StrCat("KVTIER_SOCKET=", (*d)->socket_path())});
  EXPECT_EQ(env.exit_code, 0) << env.output;
  // Three probes reached the core, and their heartbeats (refused: worker 0) are nobody's error:
  // the monitors add no baseline to the error and drop panels.
  EXPECT_GE(testing::ScrapeMetric(*port, "kvtier_rpc_requests_total{rpc=\"ChannelHello\"}"), 3);
  EXPECT_EQ(testing::ScrapeMetric(*port, "kvtier_rpc_errors_total"), 0);
  EXPECT_EQ(testing::ScrapeMetric(*port, "kvtier_connections_dropped_total"), 0);
}

TEST(HealthMonitorTest, KvtierctlHealthFailsNamingTheChannelWhenNoHelloCanComplete) {
  auto d = DaemonProcess::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  {
    Impostor wedged(edge::ChannelPathFor((*d)->socket_path()), SOCK_SEQPACKET);
    // The old probe (a status over gRPC) stays green while no worker can say hello.
    RunResult status = RunProgram(
        {BuiltProgram("kvtierctl"), "--socket", (*d)->socket_path(), "status"}, absl::Seconds(20));
    EXPECT_EQ(status.exit_code, 0) << status.output;
    const absl::Time start = absl::Now();
    RunResult r = Health(**d);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "FAIL channel-hello")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "unhealthy: channel-hello,channel-heartbeat failed"))
        << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "ok   grpc-status")) << r.output;
    RunResult json = Health(**d, "0.5", "--json");
    EXPECT_TRUE(absl::StrContains(json.output, "\"failed\": \"channel-hello,channel-heartbeat\""))
        << json.output;
  }
  RunResult again = Health(**d, "2");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST(HealthMonitorTest, KvtierctlHealthFailsNamingGrpcWhenTheListenerIsDeaf) {
  auto d = DaemonProcess::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  {
    Impostor deaf((*d)->socket_path(), SOCK_STREAM);
    RunResult r = Health(**d);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "FAIL grpc-status")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "unhealthy: grpc-status failed")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "ok   channel-hello")) << r.output;
  }
  RunResult again = Health(**d, "2");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

// systemd's side of the watchdog: a datagram socket that kvtierd's sd_notify() writes to.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = Bound(path_, SOCK_DGRAM);
  }
  ~NotifySocket() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

  // WATCHDOG=1 messages received within `window`.
  int CountPings(absl::Duration window) {
    int pings = 0;
    const absl::Time end = absl::Now() + window;
    for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(end - now)) + 1) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_.get(), buf, sizeof(buf), 0);
      if (n > 0 && absl::StrContains(absl::string_view(buf, n), "WATCHDOG=1")) ++pings;
    }
    return pings;
  }
  // Drops whatever arrived so far.
  void Drain() {
    char buf[4096];
    while (recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
  }

 private:
  std::string path_;
  edge::UniqueFd fd_;
};

// Runs kvtierd under a watchdog of 4 s (a ping a second, 333 ms for each check of the
// self-probe) and checks that the pings stop while an impostor of `type` holds the path
// `wedge(daemon)`, that the log names `failed_check`, and that the pings come back after.
void ExpectPingsStopWhileWedged(const std::function<std::string(const DaemonProcess&)>& wedge,
                                int type, const std::string& failed_check) {
  char tmpl[] = "/tmp/kvtier-notify-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  NotifySocket systemd(absl::StrCat(tmpl, "/notify"));
  auto d = DaemonProcess::Start(
      {.env = {absl::StrCat("NOTIFY_SOCKET=", systemd.path()), "WATCHDOG_USEC=4000000"}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GE(systemd.CountPings(absl::Seconds(3.5)), 2) << (*d)->Log();
  {
    Impostor impostor(wedge(**d), type);
    EXPECT_TRUE((*d)->WaitForLog("watchdog: no ping to systemd", absl::Seconds(5))) << (*d)->Log();
    EXPECT_TRUE(absl::StrContains((*d)->Log(), absl::StrCat(failed_check, ": DEADLINE_EXCEEDED")))
        << (*d)->Log();
    systemd.Drain();
    // Three periods, each a missed ping: systemd would restart the daemon after four.
    EXPECT_EQ(systemd.CountPings(absl::Seconds(3)), 0) << (*d)->Log();
  }
  EXPECT_GE(systemd.CountPings(absl::Seconds(3.5)), 1) << (*d)->Log();
  EXPECT_TRUE((*d)->WaitForLog("watchdog: the self-probe passes again", absl::Seconds(1)));
  std::filesystem::remove_all(tmpl);
}

TEST(HealthMonitorTest, WatchdogStopsPingingWhileTheChannelIsWedgedAndResumesAfter) {
  ExpectPingsStopWhileWedged(
      [](const DaemonProcess& d) { return edge::ChannelPathFor(d.socket_path()); }, SOCK_SEQPACKET,
      "channel-hello");
}

TEST(HealthMonitorTest, WatchdogStopsPingingWhileTheGrpcListenerIsDeafAndResumesAfter) {
  ExpectPingsStopWhileWedged([](const DaemonProcess& d) { return d.socket_path(); }, SOCK_STREAM,
                             "grpc-status");
}

}  // namespace
}  // namespace kvtier
