// Attack: one worker sends maximum-size snapshots (limits.max_snapshot_entries pages) on many
// sequences (issue 31, rows 6 and 8). Pages the pools cannot take stay in T0 and cost no quota,
// and every snapshot past the pools' room runs the second grant pass (a sort of every page) in
// the daemon. The daemon's heap must stay within its entry budget (refusals name the limit), and
// another worker's heartbeats must keep their deadline meanwhile.

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/manual_session.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMaxSnapshotPages = uint64_t{1} << 21;  // limits.max_snapshot_entries default
constexpr uint64_t kWorkerEntries = uint64_t{1} << 24;     // limits.max_worker_entries default
constexpr int kSequences = 16;                             // 8 more than the budget holds
constexpr absl::Duration kDeadline = absl::Milliseconds(200);  // the client's rpc_deadline

ClientOptions Options(const std::string& address, const std::string& name) {
  ClientOptions o;
  o.address = address;
  o.registration = SmallRegistration();
  o.registration.set_worker_name(name);
  o.background_heartbeat = false;
  return o;
}

// The victim, in a child forked before this process touches gRPC: a heartbeat every 50 ms over
// the memory channel (the client's default) until `stop` closes; writes "beats late failed
// p50_us p99_us" to `report`.
pid_t ForkVictim(const std::string& address, int* stop_write, int* report_read) {
  int stop[2], rep[2];
  if (pipe(stop) != 0 || pipe(rep) != 0) return -1;
  const pid_t pid = fork();
  if (pid != 0) {
    close(stop[0]);
    close(rep[1]);
    *stop_write = stop[1];
    *report_read = rep[0];
    return pid;
  }
  close(stop[1]);
  close(rep[0]);
  auto client = WorkerClient::Connect(Options(address, "victim"));
  if (!client.ok()) {
    dprintf(rep[1], "connect failed: %s\n", client.status().ToString().c_str());
    _exit(2);
  }
  std::vector<double> us;
  int late = 0, failed = 0;
  pollfd p{stop[0], POLLIN, 0};
  while (poll(&p, 1, 50) == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = (*client)->HeartbeatOnce().ok();
    const double took =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    us.push_back(took);
    failed += ok ? 0 : 1;
    late += took > absl::ToDoubleMicroseconds(kDeadline) ? 1 : 0;
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us.empty() ? 0.0 : us[std::min(us.size() - 1, size_t(q * us.size()))];
  };
  dprintf(rep[1], "%zu %d %d %.0f %.0f\n", us.size(), late, failed, at(0.5), at(0.99));
  _exit(0);
}

TEST(SnapshotFloodTest, MaximumSnapshotsOnManySequencesAreBudgetedAndHeartbeatsKeepTheirDeadline) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();
  int stop = -1, report = -1;
  const pid_t victim = ForkVictim(address, &stop, &report);
  ASSERT_GT(victim, 0);

  ClientOptions o = Options(address, "attacker");
  o.rpc_deadline = absl::Seconds(20);  // its own snapshots may take long; the victim's may not
  auto attacker = WorkerClient::Connect(o);
  ASSERT_TRUE(attacker.ok()) << attacker.status();
  v1::PolicyConfig policy;  // wants 90% of the pages in the pools, which take a few thousand
  policy.set_name("hierarchy");
  policy.set_hbm_ratio(0.1);
  v1::SubmitSnapshotRequest snap;
  snap.set_length(kMaxSnapshotPages * 16);
  snap.set_num_pages(kMaxSnapshotPages);
  snap.mutable_page_scores()->Resize(static_cast<int>(kMaxSnapshotPages), 1.0f);
  snap.mutable_current_tiers()->assign(kMaxSnapshotPages, '\0');

  absl::SleepFor(absl::Milliseconds(300));  // the victim's idle heartbeats first
  const uint64_t rss0 = ResidentBytes((*daemon)->pid());
  int accepted = 0;
  std::vector<std::string> refusals;
  const absl::Time give_up = absl::Now() + absl::Seconds(40);
  uint64_t rss_budget = 0;  // once the budget's worth was accepted
  for (int i = 0; i < kSequences && absl::Now() < give_up; ++i) {
    if (i == static_cast<int>(kWorkerEntries / kMaxSnapshotPages)) {
      rss_budget = ResidentBytes((*daemon)->pid());
    }
    absl::StatusOr<uint64_t> seq = (*attacker)->OpenSequence(0, policy, "flood");
    ASSERT_TRUE(seq.ok()) << seq.status();
    snap.set_sequence_id(*seq);
    absl::StatusOr<v1::TierPlan> plan = (*attacker)->SubmitSnapshot(snap);
    if (plan.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      refusals.push_back(std::string(plan.status().message()));
    }
  }
  const uint64_t rss1 = ResidentBytes((*daemon)->pid());
  close(stop);
  std::string line(256, '\0');
  line.resize(std::max<ssize_t>(0, read(report, line.data(), line.size())));
  close(report);
  int status = 0;
  waitpid(victim, &status, 0);

  auto mib = [](uint64_t from, uint64_t to) {
    return (static_cast<double>(to) - static_cast<double>(from)) / (1 << 20);
  };
  std::printf(
      "flood: %d of %d maximum-size snapshots accepted; daemon RSS %.0f MiB -> %.0f after 8 -> "
      "%.0f after %d (+%.1f MiB, %.1f MiB per accepted sequence); victim: beats late failed "
      "p50_us p99_us = %s",
      accepted, kSequences, rss0 / 1048576.0, rss_budget / 1048576.0, rss1 / 1048576.0, kSequences,
      mib(rss0, rss1), mib(rss0, rss1) / std::max(1, accepted), line.c_str());
  // Heap: the budget's worth (8 sequences: their tiers and plans in flight, a few MiB each, and
  // the allocator's share of the requests' buffers), and nothing more for the refused ones.
  EXPECT_LT(mib(rss0, rss1), 256) << "daemon RSS grew past its budget";
  EXPECT_LT(mib(rss_budget, rss1), 48) << "refused snapshots grew the daemon's heap";
  // The budget: 8 maximum-size sequences per worker; the rest refused, naming the limit.
  EXPECT_EQ(accepted, static_cast<int>(kWorkerEntries / kMaxSnapshotPages));
  EXPECT_FALSE(refusals.empty()) << "no snapshot was refused";
  for (const std::string& refusal : refusals) {
    EXPECT_NE(refusal.find("limits.max_worker_entries (16777216)"), std::string::npos) << refusal;
  }
  // The victim's heartbeats: none failed, almost none past the client's deadline.
  size_t beats = 0;
  int late = -1, failed = -1;
  ASSERT_EQ(std::sscanf(line.c_str(), "%zu %d %d", &beats, &late, &failed), 3) << line;
  EXPECT_EQ(failed, 0) << line;
  EXPECT_LE(late, static_cast<int>(beats / 10)) << line;
}

}  // namespace
}  // namespace kvtier::testing
