// The descriptor sink (daemon/kvtierd/descriptor_sink.h): descriptors a peer chose close off
// the caller's thread, sockets at once, unix sockets drained of the descriptors queued on them
// first; a close that blocks anyway shows as Stalled() and does not hold up the destructor past
// its bound.

#include "daemon/kvtierd/descriptor_sink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

// A loopback TCP socket whose close() would block for 30 s (send buffer full, the peer never
// reads, SO_LINGER on); its listener goes in `*keep`.
edge::UniqueFd LingeringSocket(std::vector<edge::UniqueFd>* keep) {
  edge::UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int small = 4096;
  setsockopt(l.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(l.get(), 4), 0);
  EXPECT_EQ(getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  keep->push_back(std::move(l));
  edge::UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  EXPECT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  fcntl(s.get(), F_SETFL, fcntl(s.get(), F_GETFL) | O_NONBLOCK);
  std::string junk(1 << 16, 'x');
  while (send(s.get(), junk.data(), junk.size(), MSG_NOSIGNAL) > 0) {
  }
  linger lg{1, 30};
  setsockopt(s.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  return s;
}

// A unix connection with `inside` queued on it (SCM_RIGHTS, the sender's copy closed). Call it
// as a statement of its own: a by-value argument closes at the end of the caller's full
// expression, and inside `sink.Close(Carrying(...))` that is after the sink may have dropped the
// queued copy, which would leave the last reference (and a lingering close) to the test thread.
edge::UniqueFd Carrying(edge::UniqueFd inside) {
  int p[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p), 0);
  edge::UniqueFd a(p[0]), b(p[1]);
  const int fd = inside.get();
  EXPECT_TRUE(edge::SendMessage(a.get(), v1::ChannelRequest(), {fd}).ok());
  return b;
}

bool Drained(const DescriptorSink& sink, absl::Duration within) {
  const absl::Time end = absl::Now() + within;
  while (sink.backlog() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  return sink.backlog() == 0;
}

TEST(DescriptorSinkTest, ClosesALingeringSocketAtOnceOffTheCallersThread) {
  std::vector<edge::UniqueFd> keep;
  DescriptorSink sink;
  const absl::Time start = absl::Now();
  sink.Close(LingeringSocket(&keep));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(Drained(sink, absl::Seconds(2)));
  EXPECT_EQ(sink.Stalled(), absl::ZeroDuration());
}

TEST(DescriptorSinkTest, DrainsTheDescriptorsQueuedOnAUnixConnectionBeforeClosingIt) {
  std::vector<edge::UniqueFd> keep;
  DescriptorSink sink;
  edge::UniqueFd carrying = Carrying(LingeringSocket(&keep));
  sink.Close(std::move(carrying));
  EXPECT_TRUE(Drained(sink, absl::Seconds(2)));  // 30 s had the queued socket lingered
}

TEST(DescriptorSinkTest, AStuckCloseShowsAsStalledAndTheDestructorKeepsItsBound) {
  std::vector<edge::UniqueFd> keep;
  std::string warned;
  auto sink = std::make_unique<DescriptorSink>(
      DescriptorSink::Options{.shutdown_wait = absl::Milliseconds(200),
                              .log_warning = [&warned](const std::string& m) { warned = m; }});
  // Nested deeper than the sink drains: the innermost connection's close drops a lingering
  // socket that nobody could make abortive.
  edge::UniqueFd nested = LingeringSocket(&keep);
  for (int level = 0; level < 3; ++level) nested = Carrying(std::move(nested));
  sink->Close(std::move(nested));
  sink->Close(edge::UniqueFd(dup(STDERR_FILENO)));  // waits behind it
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GE(sink->Stalled(), absl::Milliseconds(200));
  EXPECT_EQ(sink->backlog(), 2u);
  const absl::Time start = absl::Now();
  sink.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_NE(warned.find("still closing"), std::string::npos) << warned;
}

}  // namespace
}  // namespace kvtier::daemon
