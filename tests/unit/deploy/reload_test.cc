// SIGHUP semantics of kvtierd (daemon/kvtierd/reload.h): what is applied, what needs a restart.

#include "daemon/kvtierd/reload.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

DaemonConfig Parse(const std::string& text) {
  auto config = ParseConfig(text, "test.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(ReloadTest, IdenticalConfigsHaveNoChanges) {
  DaemonConfig c = Parse("");
  ConfigChanges changes = DiffConfigs(c, c);
  EXPECT_THAT(changes.applied, IsEmpty());
  EXPECT_THAT(changes.needs_restart, IsEmpty());
}

TEST(ReloadTest, LimitsLeasesAndLogLevelAreAppliedWithOldAndNewValues) {
  DaemonConfig running = Parse("[limits]\nmax_workers = 1\n");
  DaemonConfig fresh = Parse(
      "[server]\nlog_level = \"debug\"\n[limits]\nmax_workers = 3\n"
      "worker_ddr_quota_mib = 16\n[leases]\nttl_ms = 4000\n");
  ConfigChanges changes = DiffConfigs(running, fresh);
  EXPECT_THAT(changes.applied,
              ElementsAre("server.log_level \"info\" -> \"debug\"", "limits.max_workers 1 -> 3",
                          "limits.worker_ddr_quota_mib 0 -> 16", "leases.ttl_ms 10000 -> 4000"));
  EXPECT_THAT(changes.needs_restart, IsEmpty());
}

TEST(ReloadTest, PoolsListenersAndPolicyNeedARestart) {
  DaemonConfig running = Parse("");
  DaemonConfig fresh = Parse(
      "[server]\nmetrics = \"127.0.0.1:9999\"\n[pools]\nddr_mib = 2048\nmode = \"0600\"\n"
      "group = \"gpu\"\n[policy]\nevict_ratio = 0.25\n");
  ConfigChanges changes = DiffConfigs(running, fresh);
  EXPECT_THAT(changes.applied, IsEmpty());
  EXPECT_THAT(changes.needs_restart,
              ElementsAre("server.metrics \"auto\" -> \"127.0.0.1:9999\"",
                          "pools.ddr_mib 1024 -> 2048", "pools.group \"\" -> \"gpu\"",
                          "pools.mode 0660 -> 0600", "policy.evict_ratio 0 -> 0.25"));
}

TEST(ReloadTest, ApplyReloadableKeepsRestartOnlySettingsSoTheyAreReportedAgain) {
  DaemonConfig running = Parse("");
  DaemonConfig fresh = Parse("[limits]\nmax_workers = 7\n[pools]\nddr_mib = 64\n");
  DaemonConfig next = ApplyReloadable(running, fresh);
  EXPECT_EQ(next.core.max_workers, 7u);
  EXPECT_EQ(next.core.ddr_pool_bytes, running.core.ddr_pool_bytes);
  ConfigChanges again = DiffConfigs(next, fresh);
  EXPECT_THAT(again.applied, IsEmpty());
  EXPECT_THAT(again.needs_restart, ElementsAre("pools.ddr_mib 1024 -> 64"));
}

// Property: for random pairs of configs, after ApplyReloadable nothing reloadable differs, and
// every difference is reported exactly once in one of the two lists.
TEST(ReloadTest, RandomConfigsEveryChangeIsReportedOnceAndApplyConverges) {
  std::mt19937 rng(20261129);
  auto random_config = [&rng] {
    std::uniform_int_distribution<int> coin(0, 1);
    std::string text = "[server]\n";
    const char* levels[] = {"debug", "info", "warning", "error"};
    text += absl::StrCat("log_level = \"", levels[rng() % 4], "\"\n");
    if (coin(rng)) text += "metrics = \"\"\n";
    text += absl::StrCat("[pools]\nddr_mib = ", 64 << (rng() % 3), "\n");
    text += absl::StrCat("[leases]\nttl_ms = ", 3000 * (1 + rng() % 3), "\n");
    text += absl::StrCat("[limits]\nmax_workers = ", 1 + rng() % 3, "\n");
    text += absl::StrCat("[policy]\nhbm_ratio = ", (rng() % 3) / 4.0, "\n");
    return text;
  };
  for (int i = 0; i < 200; ++i) {
    DaemonConfig a = Parse(random_config());
    DaemonConfig b = Parse(random_config());
    ConfigChanges changes = DiffConfigs(a, b);
    int expected =
        (a.server.log_level != b.server.log_level) +
        (a.server.metrics_address != b.server.metrics_address) +
        (a.core.ddr_pool_bytes != b.core.ddr_pool_bytes) + (a.core.lease_ttl != b.core.lease_ttl) +
        (a.core.max_workers != b.core.max_workers) + (a.policy.hbm_ratio != b.policy.hbm_ratio);
    EXPECT_EQ(changes.applied.size() + changes.needs_restart.size(), expected);
    ConfigChanges after = DiffConfigs(ApplyReloadable(a, b), b);
    EXPECT_THAT(after.applied, IsEmpty());
    EXPECT_EQ(after.needs_restart.size(), changes.needs_restart.size());
  }
}

}  // namespace
}  // namespace kvtier::daemon
