#include "edge/health_probe.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"

namespace kvtier::edge {
namespace {

class HealthProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-health-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/kvtierd.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A listener of `type` at `path` that nobody ever accepts on: connections succeed (the
  // backlog takes them) and nothing ever answers, which is what a wedged server looks like.
  static UniqueFd Deaf(const std::string& path, int type) {
    UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd.get(), 16), 0);
    return fd;
  }

  std::string dir_, socket_;
};

TEST_F(HealthProbeTest, NothingAtThePathFailsEveryCheckWithoutWaitingForTheDeadline) {
  const absl::Time start = absl::Now();
  HealthReport r = ProbeHealth({.socket_path = socket_, .timeout = absl::Seconds(5)});
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.checks.size(), 3u);
  for (const HealthCheck& c : r.checks) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.name << ": " << c.status;
  }
  EXPECT_EQ(r.FailedChecks(), "channel-hello,channel-heartbeat,grpc-status");
}

TEST_F(HealthProbeTest, ServersThatNeverAnswerFailEachCheckAtItsDeadline) {
  UniqueFd channel = Deaf(ChannelPathFor(socket_), SOCK_SEQPACKET);
  UniqueFd grpc = Deaf(socket_, SOCK_STREAM);
  const absl::Duration timeout = absl::Milliseconds(300);
  HealthReport r = ProbeHealth({.socket_path = socket_, .timeout = timeout});
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.checks.size(), 3u);
  for (const HealthCheck& c : r.checks) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded) << c.name << ": " << c.status;
    EXPECT_GE(c.latency, timeout - absl::Milliseconds(5)) << c.name;
    EXPECT_LT(c.latency, timeout + absl::Seconds(1)) << c.name;
  }
}

TEST_F(HealthProbeTest, AChannelThatAnswersPassesEvenWhenItRefusesAndGrpcIsNamedAlone) {
  UniqueFd listener = Deaf(ChannelPathFor(socket_), SOCK_SEQPACKET);
  // Answers two requests as kvtierd would: a hello with a ticket, a heartbeat for no session
  // refused.
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {
      UniqueFd c(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      v1::ChannelRequest request;
      ASSERT_TRUE(ReceiveMessage(c.get(), &request).ok());
      v1::ChannelReply reply;
      if (request.has_hello()) {
        reply.set_ticket("t");
        reply.set_peer_uid(getuid());
      } else {
        EXPECT_TRUE(request.has_heartbeat());
        reply = ChannelErrorReply(absl::FailedPreconditionError("unknown worker 0"));
      }
      ASSERT_TRUE(SendMessage(c.get(), reply, {}).ok());
    }
  });
  HealthReport r = ProbeHealth({.socket_path = socket_, .timeout = absl::Seconds(2)});
  server.join();
  ASSERT_EQ(r.checks.size(), 3u);
  EXPECT_TRUE(r.checks[0].status.ok()) << r.checks[0].status;
  EXPECT_TRUE(r.checks[1].status.ok()) << r.checks[1].status;
  EXPECT_NE(r.checks[1].detail.find("refused"), std::string::npos) << r.checks[1].detail;
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.FailedChecks(), "grpc-status");
}

}  // namespace
}  // namespace kvtier::edge
