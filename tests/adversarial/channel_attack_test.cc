// Attacks on kvtierd's memory channel (daemon/kvtierd/channel_server.h), from real processes
// against a real daemon: descriptors whose close() blocks, sent to the channel and to a kept
// heartbeat connection; many silent connections from one process; a channel that stops
// answering heartbeats. Whatever the attacker does, a real worker (the client library) still
// says hello, registers, fetches extents and keeps its lease, and SIGTERM stops the daemon
// within a bound.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/manual_session.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

// How long an attacker's socket lingers in close(): far past every bound below.
constexpr int kLingerSeconds = 30;

std::unique_ptr<DaemonProcess> StartDaemon(int* metrics_port) {
  absl::StatusOr<int> port = FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status();
  *metrics_port = port.value_or(0);
  auto d = DaemonProcess::Start({.config_text =
                                     "[server]\nreap_interval_ms = 50\n[leases]\nttl_ms = 1000\n"
                                     "heartbeat_ms = 250\n",
                                 .metrics_address = absl::StrCat("127.0.0.1:", *metrics_port)});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

double Dropped(int port, const std::string& reason, double expected) {
  return WaitForMetric(
      port, absl::StrCat("kvtier_connections_dropped_total{reason=\"", reason, "\"}"), expected);
}

// A process of the test's making, stopped (SIGKILL) and reaped on destruction.
struct Child {
  pid_t pid = -1;
  int ready = -1;  // the child writes one byte here once its attack is in place
  Child() = default;
  Child(Child&& o) noexcept : pid(std::exchange(o.pid, -1)), ready(std::exchange(o.ready, -1)) {}
  Child& operator=(Child&&) = delete;
  ~Child() { Stop(); }
  void Stop() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (ready >= 0) close(ready);
    pid = -1;
    ready = -1;
  }
  // True once the child said it is ready, within `timeout`.
  bool WaitReady(absl::Duration timeout) const {
    pollfd p{ready, POLLIN, 0};
    char c;
    return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1 &&
           read(ready, &c, 1) == 1;
  }
};

// Runs `attack` in a child process; it signals readiness by writing to the fd it is given and
// then stays until killed.
template <typename Fn>
Child Spawn(Fn attack) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return {};
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    close(p[0]);
    attack(p[1]);
    for (;;) pause();
  }
  close(p[1]);
  c.ready = p[0];
  return c;
}

void SayReady(int fd) { (void)!write(fd, "r", 1); }

// A loopback TCP listener that never accepts or reads, with a small receive buffer; -1 on error.
int SilentListener() {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int small = 4096;
  setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 4) != 0) return -1;
  return l;
}

// A TCP socket whose close() blocks for kLingerSeconds: connected to `listener`
// (SilentListener), its send buffer full, SO_LINGER on.
int LingeringSocket(int listener) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int small = 4096;
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  std::string junk(1 << 16, 'x');
  while (send(s, junk.data(), junk.size(), MSG_NOSIGNAL) > 0) {
  }
  linger lg{1, kLingerSeconds};
  setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  return s;
}

// Sends `request` on `fd` with a lingering socket attached, from a process that exits at once:
// the daemon's copy is then the last (a process's exit never lingers), and its close is the one
// that blocks, whichever comes first. The listener stays open in `*listeners` (closing it would
// reset the connection and free the close).
bool SendLingering(int fd, const v1::ChannelRequest& request, std::vector<int>* listeners) {
  const int l = SilentListener();
  if (l < 0) return false;
  listeners->push_back(l);
  const pid_t sender = fork();
  if (sender == 0) {
    const int s = LingeringSocket(l);
    _exit(s >= 0 && edge::SendMessage(fd, request, {s}).ok() ? 0 : 1);
  }
  int status = 0;
  return sender > 0 && waitpid(sender, &status, 0) == sender && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

// Hellos on the channel, each timed; the slowest, or an error.
absl::StatusOr<absl::Duration> SlowestHello(const DaemonProcess& d, int n) {
  absl::Duration slowest;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::ChannelReply> hello = ChannelHello(d.address());
    if (!hello.ok()) return hello.status();
    slowest = std::max(slowest, absl::Now() - start);
  }
  return slowest;
}

SimWorkerOptions Sim(const DaemonProcess& d) {
  SimWorkerOptions o;
  o.address = d.address();
  o.name = "victim";
  return o;
}

// A worker that says hello, registers, fetches extents (its plans offload pages into them) and
// keeps its lease over `hold`: same worker, same generation, connected all along.
void WorkerIsServed(const DaemonProcess& d, absl::Duration hold) {
  auto w = SimWorker::Connect(Sim(d));
  ASSERT_TRUE(w.ok()) << w.status();
  auto seq = (*w)->Open();
  ASSERT_TRUE(seq.ok()) << seq.status();
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*w)->Step(*seq, 160).ok());
  EXPECT_GT((*w)->client().pool(v1::POOL_KIND_DDR)->mapped_extents(), 0u);
  const uint64_t id = (*w)->client().worker_id();
  const uint64_t generation = (*w)->client().generation();
  const absl::Time end = absl::Now() + hold;
  while (absl::Now() < end) {
    EXPECT_TRUE((*w)->client().connected());
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ((*w)->client().worker_id(), id);
  EXPECT_EQ((*w)->client().generation(), generation) << "the lease lapsed: it registered again";
  EXPECT_TRUE((*w)->Step(*seq, 16).ok());
}

TEST(ChannelAttackTest, LingeringSocketsSentToTheChannelAndALaneWedgeNothing) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  const std::string channel = edge::ChannelPathFor(d->socket_path());
  // More messages than the channel ever had threads, and one on a kept heartbeat connection.
  Child attacker = Spawn([&](int ready) {
    std::vector<int> keep;
    absl::StatusOr<ManualSession> session = RegisterByHand(d->address());
    if (!session.ok()) _exit(2);
    auto beats = edge::ConnectChannel(channel, absl::Seconds(2));
    v1::ChannelRequest beat;
    *beat.mutable_heartbeat() = session->Heartbeat();
    if (!beats.ok() || !edge::ChannelExchange(beats->get(), beat, nullptr).ok()) _exit(3);
    if (!SendLingering(beats->get(), beat, &keep)) _exit(4);
    keep.push_back(beats->Release());
    // Connections that send nothing first: a server that serves one connection per thread
    // reads the messages below only after their senders are gone.
    for (int i = 0; i < 4; ++i) {
      auto c = edge::ConnectChannel(channel, absl::Seconds(2));
      if (c.ok()) keep.push_back(c->Release());
    }
    v1::ChannelRequest hello;
    hello.mutable_hello();
    for (int i = 0; i < 8; ++i) {
      auto c = edge::ConnectChannel(channel, absl::Seconds(2));
      if (c.ok() && SendLingering(c->get(), hello, &keep)) keep.push_back(c->Release());
    }
    SayReady(ready);
  });
  ASSERT_GT(attacker.pid, 0);
  ASSERT_TRUE(attacker.WaitReady(absl::Seconds(10)));

  absl::StatusOr<absl::Duration> hello = SlowestHello(*d, 5);
  ASSERT_TRUE(hello.ok()) << hello.status();
  std::printf("slowest hello under attack: %s\n", absl::FormatDuration(*hello).c_str());
  EXPECT_LT(*hello, absl::Milliseconds(500));
  ASSERT_NO_FATAL_FAILURE(WorkerIsServed(*d, absl::Seconds(2.5)));
  // Every message that came with a descriptor dropped its connection, and was counted.
  EXPECT_GE(Dropped(port, "channel_descriptors", 9), 9);

  const absl::Time stop = absl::Now();
  EXPECT_EQ(d->Stop(SIGTERM, absl::Seconds(8)), 0);
  std::printf("SIGTERM to exit: %s\n", absl::FormatDuration(absl::Now() - stop).c_str());
  EXPECT_LT(absl::Now() - stop, absl::Seconds(4));
}

TEST(ChannelAttackTest, SilentConnectionsOfOneProcessStarveNoHello) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  const std::string channel = edge::ChannelPathFor(d->socket_path());
  // 48 connections that never send a thing, each connected again as soon as the daemon drops it.
  constexpr int kSilent = 48;
  Child attacker = Spawn([&](int ready) {
    std::vector<edge::UniqueFd> silent(kSilent);
    bool said = false;
    for (;;) {
      for (edge::UniqueFd& c : silent) {
        pollfd p{c.get(), POLLIN, 0};
        if (c.valid() && poll(&p, 1, 0) == 0) continue;
        auto fresh = edge::ConnectChannel(channel, absl::Seconds(5));
        c = fresh.ok() ? *std::move(fresh) : edge::UniqueFd();
      }
      if (!said) SayReady(ready);
      said = true;
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  ASSERT_GT(attacker.pid, 0);
  ASSERT_TRUE(attacker.WaitReady(absl::Seconds(10)));

  absl::StatusOr<absl::Duration> hello = SlowestHello(*d, 10);
  ASSERT_TRUE(hello.ok()) << hello.status();
  std::printf("slowest of 10 hellos beside %d silent connections: %s\n", kSilent,
              absl::FormatDuration(*hello).c_str());
  EXPECT_LT(*hello, absl::Milliseconds(500));
  ASSERT_NO_FATAL_FAILURE(WorkerIsServed(*d, absl::Seconds(1)));
  EXPECT_GE(Dropped(port, "channel_deadline", 1), 1);

  // Silent connections cost their uid's budget: past it the next is refused, and says why.
  std::vector<edge::UniqueFd> mine;
  for (int i = 0; i < 80; ++i) {
    auto c = edge::ConnectChannel(channel, absl::Seconds(1));
    if (c.ok()) mine.push_back(*std::move(c));
  }
  absl::Status refused;
  const absl::Time give_up = absl::Now() + absl::Milliseconds(400);
  while (refused.ok() && absl::Now() < give_up) {
    for (const edge::UniqueFd& c : mine) {
      pollfd p{c.get(), POLLIN, 0};
      v1::ChannelReply reply;
      if (poll(&p, 1, 0) != 1 || !edge::ReceiveMessage(c.get(), &reply).ok()) continue;
      if (reply.code() == static_cast<int>(absl::StatusCode::kResourceExhausted)) {
        refused = absl::ResourceExhaustedError(reply.message());
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("max_connections_per_uid"), absl::string_view::npos) << refused;
  EXPECT_GE(Dropped(port, "channel_uid_full", 1), 1);
  mine.clear();
  attacker.Stop();

  const absl::Time stop = absl::Now();
  EXPECT_EQ(d->Stop(SIGTERM, absl::Seconds(8)), 0);
  EXPECT_LT(absl::Now() - stop, absl::Seconds(4));
}

// CPU time process `pid` has used (user and system).
absl::Duration CpuTime(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  uint64_t ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stoull(field);
  }
  return absl::Seconds(static_cast<double>(ticks) / sysconf(_SC_CLK_TCK));
}

// The RLIMIT_NOFILE under which process `pid` can open one more descriptor, and no other (the
// limit bounds descriptor numbers: the lowest free one must be under it).
int LimitLeavingOneFree(pid_t pid) {
  std::set<int> open;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    open.insert(std::stoi(e.path().filename().string()));
  }
  int free = 0;
  for (int limit = 0;; ++limit) {
    if (open.count(limit) == 0 && ++free == 2) return limit;
  }
}

TEST(ChannelAttackTest, OutOfDescriptorsTheChannelBacksOffInsteadOfSpinning) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  const std::string channel = edge::ChannelPathFor(d->socket_path());
  absl::SleepFor(absl::Milliseconds(300));  // its start-up done
  rlimit old{};
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, nullptr, &old), 0);
  const rlimit low{static_cast<rlim_t>(LimitLeavingOneFree(d->pid())), old.rlim_max};
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, &low, nullptr), 0);
  std::vector<edge::UniqueFd> silent;
  for (int i = 0; i < 24; ++i) {
    auto c = edge::ConnectChannel(channel, absl::Seconds(1));
    if (c.ok()) silent.push_back(*std::move(c));
  }
  const absl::Duration cpu = CpuTime(d->pid());
  absl::SleepFor(absl::Seconds(2));
  const double share = (CpuTime(d->pid()) - cpu) / absl::Seconds(2);
  std::printf("kvtierd out of descriptors, %zu connections waiting: %.0f%% of a core\n",
              silent.size(), 100 * share);
  EXPECT_LT(share, 0.3);
  EXPECT_TRUE(d->WaitForLog("memory channel: accept: ", absl::Seconds(1)));

  silent.clear();
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, &old, nullptr), 0);
  absl::StatusOr<v1::ChannelReply> hello;
  const absl::Time give_up = absl::Now() + absl::Seconds(3);
  do {
    hello = ChannelHello(d->address());
  } while (!hello.ok() && absl::Now() < give_up);
  EXPECT_TRUE(hello.ok()) << hello.status();
  const absl::Time stop = absl::Now();
  EXPECT_EQ(d->Stop(SIGTERM, absl::Seconds(8)), 0);
  EXPECT_LT(absl::Now() - stop, absl::Seconds(4));
}

// A heartbeat the channel does not answer (a lane wedged, or gone) goes over gRPC that time, so
// the lease lives while gRPC works. The daemon's channel is swapped, after registration, for a
// socket that takes connections and never answers.
TEST(ChannelAttackTest, AHeartbeatTheChannelDoesNotAnswerGoesOverGrpc) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  ClientOptions options;
  options.address = d->address();
  options.registration = SmallRegistration();
  options.background_heartbeat = false;
  auto client = WorkerClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string channel = edge::ChannelPathFor(d->socket_path());
  ASSERT_EQ(rename(channel.c_str(), (channel + ".real").c_str()), 0);
  auto deaf = edge::ListenChannel(channel, 0600, static_cast<gid_t>(-1));
  ASSERT_TRUE(deaf.ok()) << deaf.status();

  const uint64_t generation = (*client)->generation();
  const absl::Time end = absl::Now() + absl::Seconds(3);  // three lease TTLs
  int beats = 0;
  while (absl::Now() < end) {
    absl::Status s = (*client)->HeartbeatOnce();
    EXPECT_TRUE(s.ok()) << s;
    ++beats;
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE((*client)->connected());
  EXPECT_EQ((*client)->generation(), generation) << "the lease lapsed: it registered again";
  std::printf("%d heartbeats with a deaf channel, all over gRPC\n", beats);
}

}  // namespace
}  // namespace kvtier::testing
