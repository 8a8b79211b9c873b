// Connections to the gRPC socket against a real kvtierd (issue #31, row 7): a uid that opens
// connections past its cap is refused with a GOAWAY that names the cap while other uids still
// connect, and a daemon out of descriptors backs off and accepts again once they are free
// (gRPC 1.51's own listener stopped for good after one EMFILE).

#include <grp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/adversarial/attack_support.h"
#include "tests/integration/support/http_get.h"

namespace kvtier::testing {
namespace {

constexpr char kConfig[] = "[server]\nreap_interval_ms = 50\nunread_timeout_ms = 500\n";
constexpr int kPerUidCap = 128;  // server.max_connections_per_uid's default

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// Whether the server sent an HTTP/2 GOAWAY on `fd` (reads what is there, without waiting).
bool GotGoaway(int fd) {
  std::string in;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) in.append(buf, static_cast<size_t>(n));
  for (size_t at = 0; at + 9 <= in.size();) {
    const size_t len = (static_cast<uint8_t>(in[at]) << 16) |
                       (static_cast<uint8_t>(in[at + 1]) << 8) | static_cast<uint8_t>(in[at + 2]);
    if (in[at + 3] == 7) return true;
    at += 9 + len;
  }
  return false;
}

struct Held {
  uint64_t opened = 0, refused = 0, kept = 0;
};

TEST(GrpcConnectionsTest, AUidPastItsConnectionCapIsRefusedAndOtherUidsStillConnect) {
  AttackDaemon d = StartAttackDaemon(kConfig);
  ASSERT_NE(d.process, nullptr);
  ASSERT_EQ(chmod(d.process->dir().c_str(), 0755), 0);  // the socket's group may reach it
  Children kids;
  const int flooder = kids.Spawn([&](int fd) {
    const gid_t groups[] = {getgid()};  // pools.group: the daemon's own group by default
    if (setgroups(1, groups) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(4);
    Held h;
    std::vector<int> fds;
    for (int i = 0; i < 200; ++i) {
      const int c = Connect(d.process->socket_path());
      if (c >= 0) fds.push_back(c);
    }
    h.opened = fds.size();
    absl::SleepFor(absl::Milliseconds(300));
    for (int c : fds) ++(GotGoaway(c) ? h.refused : h.kept);
    (void)!write(fd, &h, sizeof(h));
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (kids.Last<Held>(flooder).opened == 0 && absl::Now() < deadline) {
    ASSERT_FALSE(kids.Exited(flooder)) << "the flooder could not become uid 65534";
    absl::SleepFor(absl::Milliseconds(20));
  }
  const Held h = kids.Last<Held>(flooder);
  std::printf("uid 65534: %llu connections opened, %llu refused, %llu kept\n",
              static_cast<unsigned long long>(h.opened), static_cast<unsigned long long>(h.refused),
              static_cast<unsigned long long>(h.kept));
  EXPECT_EQ(h.opened, 200u);
  EXPECT_EQ(h.kept, static_cast<uint64_t>(kPerUidCap));
  EXPECT_EQ(h.refused, 200u - kPerUidCap);
  // Another uid (this one) is served while uid 65534 holds its share.
  std::string out;
  EXPECT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), &out)) << out;
  EXPECT_NE(d.process->Log().find("server.max_connections_per_uid: uid 65534 has 128"),
            std::string::npos)
      << d.process->Log();
  EXPECT_GE(
      ScrapeMetric(d.metrics_port, "kvtier_connections_dropped_total{reason=\"grpc_over_cap\"}"),
      200 - kPerUidCap);
}

TEST(GrpcConnectionsTest, OutOfDescriptorsTheDaemonBacksOffAndAcceptsAgainOnceTheyAreFree) {
  AttackDaemon d = StartAttackDaemon(kConfig);
  ASSERT_NE(d.process, nullptr);
  ASSERT_TRUE(StatusAnswers(*d.process, absl::Seconds(10), nullptr));
  // Leave the running daemon a handful of descriptors (as if extents and channel connections
  // had taken the rest), then connect past them.
  rlimit old{};
  ASSERT_EQ(prlimit(d.pid, RLIMIT_NOFILE, nullptr, &old), 0);
  const rlimit low{static_cast<rlim_t>(OpenDescriptors(d.pid) + 6), old.rlim_max};
  ASSERT_EQ(prlimit(d.pid, RLIMIT_NOFILE, &low, nullptr), 0);
  std::vector<int> held;
  for (int i = 0; i < 24; ++i) {
    const int fd = Connect(d.process->socket_path());
    if (fd >= 0) held.push_back(fd);
  }
  // Out of descriptors with peers waiting: the daemon neither spins nor dies.
  const absl::Duration cpu0 = CpuTime(d.pid);
  absl::SleepFor(absl::Seconds(2));
  const absl::Duration busy = CpuTime(d.pid) - cpu0;
  std::printf("out of descriptors: %zu connections held; daemon CPU %.0f ms in 2 s\n", held.size(),
              absl::ToDoubleMilliseconds(busy));
  EXPECT_LT(busy, absl::Milliseconds(600)) << "the daemon spun at EMFILE";
  // Descriptors free again: it accepts within its backoff.
  ASSERT_EQ(prlimit(d.pid, RLIMIT_NOFILE, &old, nullptr), 0);
  for (int fd : held) close(fd);
  const absl::Time freed = absl::Now();
  std::string out;
  bool answered = false;
  while (!answered && absl::Now() - freed < absl::Seconds(8)) {
    answered = StatusAnswers(*d.process, absl::Seconds(2), &out);
  }
  std::printf("served again %.0f ms after the descriptors were freed\n",
              absl::ToDoubleMilliseconds(absl::Now() - freed));
  EXPECT_TRUE(answered) << "gRPC still refuses: " << out << d.process->Log();
  EXPECT_NE(d.process->Log().find("out of file descriptors"), std::string::npos)
      << d.process->Log();
}

}  // namespace
}  // namespace kvtier::testing
