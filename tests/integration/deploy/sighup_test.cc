// SIGHUP on the real kvtierd: limits and the log level change without a restart, settings that
// need one are named, and a broken config is refused while the daemon keeps serving.

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier {
namespace {

using testing::BuiltProgram;
using testing::DaemonProcess;
using testing::RunProgram;
using testing::SimWorker;
using testing::SimWorkerOptions;

absl::StatusOr<std::unique_ptr<SimWorker>> Join(const DaemonProcess& daemon, const char* name) {
  SimWorkerOptions options{.address = daemon.address(), .name = name};
  options.background_heartbeat = false;
  return SimWorker::Connect(options);
}

// Reloads and waits for the daemon to finish handling that SIGHUP: the n-th summary line.
void Reload(DaemonProcess& daemon, const std::string& config, const std::string& wait_for) {
  ASSERT_TRUE(daemon.RewriteConfig(config).ok());
  ASSERT_TRUE(daemon.Signal(SIGHUP).ok());
  ASSERT_TRUE(daemon.WaitForLog(wait_for)) << "no \"" << wait_for << "\" in:\n" << daemon.Log();
}

TEST(SighupTest, ReloadsLimitsAndNamesSettingsThatNeedARestart) {
  auto daemon = DaemonProcess::Start({.config_text = "[limits]\nmax_workers = 1\n"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto first = Join(**daemon, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  auto refused = Join(**daemon, "second");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();

  Reload(**daemon,
         "[server]\nlog_level = \"debug\"\nreap_interval_ms = 250\n[limits]\nmax_workers = 2\n"
         "[policy]\nevict_ratio = 0.1\n",
         "SIGHUP: reloaded");
  const std::string log = (*daemon)->Log();
  for (const char* line :
       {"SIGHUP: reloaded server.log_level \"info\" -> \"debug\", limits.max_workers 1 -> 2",
        "SIGHUP: server.reap_interval_ms 500 -> 250 needs a restart",
        "SIGHUP: policy.evict_ratio 0 -> 0.1 needs a restart"}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  }
  auto second = Join(**daemon, "second");
  EXPECT_TRUE(second.ok()) << "max_workers was not reloaded: " << second.status();
  auto third = Join(**daemon, "third");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
}

TEST(SighupTest, LogLevelChangeIsLoggedAtTheOldLevelAndThenFilters) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Reload(**daemon, "[server]\nlog_level = \"warning\"\n",
         "SIGHUP: reloaded server.log_level \"info\" -> \"warning\"");
  // A second reload: its restart warning shows, its info summary no longer does.
  Reload(**daemon, "[server]\nlog_level = \"warning\"\n[policy]\ncompress_ratio = 0.2\n",
         "SIGHUP: policy.compress_ratio 0 -> 0.2 needs a restart");
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0);
  const std::string log = (*daemon)->Log();
  EXPECT_EQ(log.find("SIGHUP: reloaded (no change"), std::string::npos) << log;
  EXPECT_EQ(log.find("received SIGTERM"), std::string::npos) << "info after warning:\n" << log;
}

TEST(SighupTest, BrokenConfigIsRefusedAndTheDaemonKeepsItsLimits) {
  auto daemon = DaemonProcess::Start({.config_text = "[limits]\nmax_workers = 1\n"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto first = Join(**daemon, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  Reload(**daemon, "[limits]\nmax_workers = \"two\"\n", "SIGHUP: keeping the running config");
  EXPECT_NE((*daemon)->Log().find("limits.max_workers"), std::string::npos) << (*daemon)->Log();
  auto status =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", (*daemon)->socket_path(), "status"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  auto second = Join(**daemon, "second");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
}

}  // namespace
}  // namespace kvtier
