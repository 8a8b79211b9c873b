// Defaults for a host with several daemons or none (issue "operating on a fleet", item 5):
// metrics only for the host's daemon unless configured, $KVTIER_SOCKET for every program, and
// errors that name the socket or port tried. Real kvtierd and kvtierctl processes.

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/support/daemon_process.h"

namespace kvtier {
namespace {

using testing::BuiltProgram;
using testing::RunProgram;
using testing::SpawnProgram;

class HostDefaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("KVTIER_SOCKET");  // the children inherit ours; each test sets its own
    char tmpl[] = "/tmp/kvtier-defaults-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Small pools; every other key (server.metrics among them) keeps its default.
    config_ = dir_ + "/small.toml";
    std::ofstream(config_) << "[pools]\nddr_mib = 64\ncompressed_mib = 32\n";
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  // Starts kvtierd on the small config with `args` and `env`; waits until `socket` answers.
  ::testing::AssertionResult StartDaemon(const std::vector<std::string>& args,
                                         const std::vector<std::string>& env,
                                         const std::string& socket, const std::string& log) {
    std::vector<std::string> argv = {BuiltProgram("kvtierd"), "--config", config_};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_t pid = SpawnProgram(argv, log, env);
    pids_.push_back(pid);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      struct stat st;
      if (stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
          RunProgram({BuiltProgram("kvtierctl"), "--socket", socket, "status"}).exit_code == 0) {
        return ::testing::AssertionSuccess();
      }
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        pids_.pop_back();
        return ::testing::AssertionFailure() << "kvtierd exited: " << Read(log);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return ::testing::AssertionFailure() << "no socket at " << socket << ": " << Read(log);
  }

  static std::string Read(const std::string& path) { return RunProgram({"/bin/cat", path}).output; }

  std::string dir_, config_;
  std::vector<pid_t> pids_;
};

// Two daemons started the way a developer starts one (`kvtierd --socket PATH`) share the host:
// neither claims the metrics port of the host's daemon, and each says so.
TEST_F(HostDefaultsTest, TwoDaemonsOnOtherSocketsServeNoMetricsAndBothRun) {
  const std::string a = dir_ + "/a.sock", b = dir_ + "/b.sock";
  ASSERT_TRUE(StartDaemon({"--socket", a}, {}, a, dir_ + "/a.log"));
  ASSERT_TRUE(StartDaemon({"--socket", b}, {}, b, dir_ + "/b.log"));
  for (const std::string& sock : {a, b}) {
    auto r = RunProgram({BuiltProgram("kvtierctl"), "--socket", sock, "status"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "metrics")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "off")) << r.output;
  }
  EXPECT_TRUE(absl::StrContains(Read(dir_ + "/a.log"), "metrics off (server.metrics = \"auto\""))
      << Read(dir_ + "/a.log");
}

TEST_F(HostDefaultsTest, AMetricsPortInUseIsAnErrorNamingThePort) {
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(holder, 1), 0);
  socklen_t n = sizeof(addr);
  getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &n);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  auto r = RunProgram({BuiltProgram("kvtierd"), "--socket", dir_ + "/m.sock", "--metrics", address},
                      absl::Seconds(20));
  close(holder);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "cannot serve metrics on " + address)) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "Address already in use")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "--metrics")) << r.output;  // where it came from
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/m.sock")) << "it served despite the error";
}

// $KVTIER_SOCKET alone points kvtierd and kvtierctl at the same socket; --socket wins over it.
TEST_F(HostDefaultsTest, KvtierSocketIsHonouredByKvtierdAndKvtierctl) {
  const std::string sock = dir_ + "/env.sock";
  const std::string env = "KVTIER_SOCKET=" + sock;
  ASSERT_TRUE(StartDaemon({"--metrics", ""}, {env}, sock, dir_ + "/env.log"));
  EXPECT_TRUE(absl::StrContains(Read(dir_ + "/env.log"), "socket " + sock + " (KVTIER_SOCKET"))
      << Read(dir_ + "/env.log");
  auto status = RunProgram({BuiltProgram("kvtierctl"), "status"}, absl::Seconds(10), {env});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_TRUE(absl::StrContains(status.output, "unix:" + sock)) << status.output;
  auto health = RunProgram({BuiltProgram("kvtierctl"), "health"}, absl::Seconds(10), {env});
  EXPECT_EQ(health.exit_code, 0) << health.output;

  const std::string other = dir_ + "/nothing-here.sock";
  auto flag = RunProgram({BuiltProgram("kvtierctl"), "--socket", other, "status"},
                         absl::Seconds(10), {env});
  EXPECT_EQ(flag.exit_code, 1) << flag.output;
  EXPECT_TRUE(absl::StrContains(flag.output, other + " (--socket)")) << flag.output;
}

TEST_F(HostDefaultsTest, KvtierctlNamesTheSocketItTriedAndWhy) {
  const std::string missing = dir_ + "/no-daemon.sock";
  auto r = RunProgram({BuiltProgram("kvtierctl"), "status"}, absl::Seconds(10),
                      {"KVTIER_SOCKET=" + missing});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "unix:" + missing + " (KVTIER_SOCKET")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "is kvtierd running")) << r.output;
  auto health = RunProgram({BuiltProgram("kvtierctl"), "health", "--timeout", "0.2"},
                           absl::Seconds(10), {"KVTIER_SOCKET=" + missing});
  EXPECT_EQ(health.exit_code, 1) << health.output;
  EXPECT_TRUE(absl::StrContains(health.output, missing + " (KVTIER_SOCKET")) << health.output;

  // Without either, the host's daemon's socket (unless one serves there on this machine).
  if (!std::filesystem::exists("/run/kvtier/kvtierd.sock")) {
    auto d = RunProgram({BuiltProgram("kvtierctl"), "status"}, absl::Seconds(10));
    EXPECT_EQ(d.exit_code, 1) << d.output;
    EXPECT_TRUE(absl::StrContains(
        d.output, "unix:/run/kvtier/kvtierd.sock (the default; --socket or KVTIER_SOCKET"))
        << d.output;
  }
}

}  // namespace
}  // namespace kvtier
