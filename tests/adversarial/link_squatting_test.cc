// Attack: link squatting (issue 31, row 10). A worker of one uid declares another GPU's host
// link with another NUMA node (which refused the other GPU's workers) or with 1 B/s (which
// capped everyone on the link at 1 B/s). Another uid's worker must still register, and get the
// grant its own declaration earns; no refusal names the squatter.

#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/fork_as.h"
#include "tests/integration/support/manual_session.h"

namespace kvtier::testing {
namespace {

constexpr uid_t kSquatter = 65534, kVictim = 65533;
constexpr double kVictimBandwidth = 5e10;

ClientOptions Declaring(const std::string& address, const std::string& link, double bandwidth,
                        uint32_t numa) {
  ClientOptions o;
  o.address = address;
  o.registration = SmallRegistration();
  v1::HostLink* l = o.registration.mutable_link();
  l->set_link_id(link);
  l->set_link_bytes_per_second(bandwidth);
  l->set_numa_node(numa);
  return o;
}

// The victim's grant on a link: a sequence whose candidates go to T1, one snapshot; the plan's
// schedule carries the worker's share of its link. -1 when something failed (said in `why`).
double GrantOf(WorkerClient& w, std::string* why) {
  v1::PolicyConfig p;
  p.set_name("hierarchy");
  p.set_hbm_ratio(0.1);
  absl::StatusOr<uint64_t> seq = w.OpenSequence(0, p, "victim");
  if (!seq.ok()) return *why = seq.status().ToString(), -1;
  constexpr uint32_t kPages = 64;
  v1::SubmitSnapshotRequest s;
  s.set_sequence_id(*seq);
  s.set_length(kPages * 16);
  s.set_num_pages(kPages);
  for (uint32_t i = 0; i < kPages; ++i) s.add_page_scores(1.0f + i % 7);
  s.mutable_current_tiers()->assign(kPages, '\0');
  absl::StatusOr<v1::TierPlan> plan = w.SubmitSnapshot(s);
  if (!plan.ok()) return *why = plan.status().ToString(), -1;
  if (!plan->has_schedule()) return *why = "the plan has no schedule", -1;
  return plan->schedule().h2d_bytes_per_second();
}

// The squatter registers two workers: one declaring link "gpu0" on NUMA node 7 (the victim's
// GPU sits on node 0), one declaring link "gpu1" at 1 B/s. It reports their ids, then keeps
// them registered until told to go.
int Squat(const std::string& address, int go, FILE* report) {
  auto a = WorkerClient::Connect(Declaring(address, "gpu0", 5e10, 7));
  auto b = WorkerClient::Connect(Declaring(address, "gpu1", 1, 0));
  if (!a.ok() || !b.ok()) {
    std::fprintf(report, "FAIL squatter: %s %s\n", a.status().ToString().c_str(),
                 b.status().ToString().c_str());
    return 1;
  }
  std::fprintf(report, "%llu %llu\n", static_cast<unsigned long long>((*a)->worker_id()),
               static_cast<unsigned long long>((*b)->worker_id()));
  char c;
  while (read(go, &c, 1) > 0) {
  }
  return 0;
}

// The victim registers on both links as it truly sees them (NUMA node 0, 50 GB/s) and reports
// "registered-gpu0 <status>" and "grant-gpu1 <bytes/s or error>".
int Victim(const std::string& address, int go, FILE* report) {
  char c;
  if (read(go, &c, 1) != 1) return 2;  // the squatter is in place
  int failures = 0;
  auto on0 = WorkerClient::Connect(Declaring(address, "gpu0", kVictimBandwidth, 0));
  std::fprintf(report, "gpu0 register: %s\n", on0.ok() ? "OK" : on0.status().ToString().c_str());
  failures += on0.ok() ? 0 : 1;
  auto on1 = WorkerClient::Connect(Declaring(address, "gpu1", kVictimBandwidth, 0));
  std::fprintf(report, "gpu1 register: %s\n", on1.ok() ? "OK" : on1.status().ToString().c_str());
  if (on1.ok()) {
    std::string why;
    const double grant = GrantOf(**on1, &why);
    std::fprintf(report, "gpu1 grant: %.0f %s\n", grant, why.c_str());
    failures += grant >= 1e6 ? 0 : 1;
  } else {
    ++failures;
  }
  return failures;
}

// What the squatter and the victim said, against a daemon started with `config_text`.
struct Outcome {
  std::string squatter_ids;  // its two workers' ids, space-separated
  std::string victim_report;
  int victim_exit = -1, squatter_exit = -1;
};

Outcome Attack(const std::string& name, const std::string& config_text) {
  Outcome out;
  auto daemon =
      DaemonProcess::Start({.config_text = config_text, .socket_path = SharedSocket(name)});
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  if (!daemon.ok()) return out;
  const std::string address = (*daemon)->address();
  Child squatter =
      ForkAs(kSquatter, [&](int go, FILE* report) { return Squat(address, go, report); });
  Child victim = ForkAs(kVictim, [&](int go, FILE* report) { return Victim(address, go, report); });
  out.squatter_ids = ReadLine(squatter.report_read);  // its workers are registered
  if (write(victim.go_write, "g", 1) != 1) ADD_FAILURE() << "the victim is gone";
  out.victim_exit = Wait(victim, &out.victim_report);
  std::string ignored;
  out.squatter_exit = Wait(squatter, &ignored);
  EXPECT_EQ(out.squatter_exit, 0) << out.squatter_ids << ignored;
  return out;
}

TEST(LinkSquattingTest, AnotherUidsDeclarationsNeitherRefuseNorThrottleAWorker) {
  const Outcome o = Attack("squat", "");
  EXPECT_EQ(o.victim_exit, 0) << o.victim_report;
  EXPECT_NE(o.victim_report.find("gpu0 register: OK"), std::string::npos) << o.victim_report;
  for (absl::string_view id : absl::StrSplit(o.squatter_ids, ' ', absl::SkipEmpty())) {
    EXPECT_EQ(o.victim_report.find(absl::StrCat("worker ", id)), std::string::npos)
        << "a refusal names the squatter (worker " << id << "): " << o.victim_report;
  }
  std::printf("squatter worker ids: %s\nvictim:\n%s", o.squatter_ids.c_str(),
              o.victim_report.c_str());
}

// An operator's [links] entry fixes the link's bandwidth and NUMA node: declarations (even of
// another uid) neither refuse a worker on it nor lower what it carries.
TEST(LinkSquattingTest, AnOperatorsLinkTableOverridesEveryDeclaration) {
  const Outcome o = Attack("table",
                           "[links]\ngpu0 = { bytes_per_second = 2e10, numa_node = 0 }\n"
                           "gpu1 = { bytes_per_second = 2e10, numa_node = 0 }\n");
  EXPECT_EQ(o.victim_exit, 0) << o.victim_report;
  // The grant never exceeds what the operator says the link carries.
  const size_t at = o.victim_report.find("gpu1 grant: ");
  ASSERT_NE(at, std::string::npos) << o.victim_report;
  EXPECT_LE(std::stod(o.victim_report.substr(at + 12)), 2e10) << o.victim_report;
}

}  // namespace
}  // namespace kvtier::testing
