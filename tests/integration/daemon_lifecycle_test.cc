// kvtierd as a process: start, status, refusal of a second daemon, bad configs, clean stop.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"

namespace kvtier {
namespace {

using testing::BuiltProgram;
using testing::DaemonProcess;
using testing::RunProgram;

TEST(DaemonLifecycleTest, KvtierctlStatusShowsPoolsAndCounts) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto r = RunProgram({BuiltProgram("kvtierctl"), "--socket", (*daemon)->socket_path(), "status"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("workers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("64.0 MiB"), std::string::npos) << r.output;  // the DDR pool size
  auto j = RunProgram(
      {BuiltProgram("kvtierctl"), "--socket", (*daemon)->socket_path(), "--json", "pools"});
  ASSERT_EQ(j.exit_code, 0) << j.output;
  EXPECT_NE(j.output.find("\"capacity_bytes\""), std::string::npos) << j.output;
}

TEST(DaemonLifecycleTest, SecondDaemonOnALiveSocketExitsAndTheFirstKeepsServing) {
  auto first = DaemonProcess::Start({});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second =
      RunProgram({BuiltProgram("kvtierd"), "--socket", (*first)->socket_path(), "--metrics", ""},
                 absl::Seconds(20));
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("already serving"), std::string::npos) << second.output;
  auto status =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", (*first)->socket_path(), "status"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
}

TEST(DaemonLifecycleTest, StaleSocketFileIsReplaced) {
  std::string dir = ::testing::TempDir() + "/stale-sock";
  std::filesystem::create_directories(dir);
  std::string sock = dir + "/kvtierd.sock";
  {
    auto crashed = DaemonProcess::Start({.socket_path = sock});
    ASSERT_TRUE(crashed.ok()) << crashed.status();
    EXPECT_EQ((*crashed)->Stop(SIGKILL), 128 + SIGKILL);
  }
  ASSERT_TRUE(std::filesystem::exists(sock));  // left behind by the crash
  auto fresh = DaemonProcess::Start({.socket_path = sock});
  EXPECT_TRUE(fresh.ok()) << fresh.status();
}

// Pool memory is unnamed (memfd extents): a daemon killed with -9 leaves nothing in /dev/shm,
// and the next one takes over both of its stale sockets.
TEST(DaemonLifecycleTest, ACrashedDaemonLeavesNoNamedMemoryAndTheNextOneStarts) {
  std::string dir = ::testing::TempDir() + "/crash-pools";
  std::filesystem::create_directories(dir);
  std::string sock = dir + "/kvtierd.sock";
  const std::string prefix = "/kvtier-crash-" + std::to_string(getpid());
  auto count = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      n += e.path().filename().string().rfind(prefix.substr(1), 0) == 0;
    }
    return n;
  };
  auto crashed = DaemonProcess::Start({.socket_path = sock, .shm_prefix = prefix});
  ASSERT_TRUE(crashed.ok()) << crashed.status();
  EXPECT_EQ(count(), 0);
  ASSERT_TRUE(std::filesystem::exists(sock + ".mem"));
  ASSERT_EQ((*crashed)->Stop(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(count(), 0);
  auto next = DaemonProcess::Start({.socket_path = sock, .shm_prefix = prefix});
  ASSERT_TRUE(next.ok()) << next.status();
  auto hello = ChannelHello("unix:" + sock);
  EXPECT_TRUE(hello.ok()) << hello.status() << (*next)->Log();
}

TEST(DaemonLifecycleTest, BadConfigNamesTheKeyAndExitsNonZero) {
  std::string path = ::testing::TempDir() + "/bad.toml";
  std::ofstream(path) << "[pools]\nddr_mb = 64\n";
  auto r = RunProgram({BuiltProgram("kvtierd"), "--config", path});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("pools.ddr_mb"), std::string::npos) << r.output;
  auto missing = RunProgram({BuiltProgram("kvtierd"), "--config", "/nonexistent.toml"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("/nonexistent.toml"), std::string::npos) << missing.output;
}

TEST(DaemonLifecycleTest, UnusableSocketDirectoryIsAClearError) {
  auto r =
      RunProgram({BuiltProgram("kvtierd"), "--socket", "/nonexistent-dir/k.sock", "--metrics", ""});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent-dir"), std::string::npos) << r.output;
}

TEST(DaemonLifecycleTest, NonLoopbackTcpIsRefused) {
  auto r = RunProgram({BuiltProgram("kvtierd"), "--tcp", "0.0.0.0:50999", "--metrics", ""});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("loopback"), std::string::npos) << r.output;
}

TEST(DaemonLifecycleTest, SigtermStopsCleanlyAndRemovesTheMemoryChannel) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string channel = (*daemon)->socket_path() + ".mem";
  EXPECT_TRUE(std::filesystem::exists(channel));
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  EXPECT_FALSE(std::filesystem::exists(channel));
  std::string log = (*daemon)->Log();
  for (const char* line : {"listening on unix:", "memory channel", "received SIGTERM", "stopped"}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  }
}

}  // namespace
}  // namespace kvtier
