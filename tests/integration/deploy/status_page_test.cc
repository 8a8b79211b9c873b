// The live views of a real kvtierd with real workers: `kvtierctl top --once` and the status page
// on the metrics port, checked against the daemon's own figures (kvtierctl --json). The page is
// then checked by tests/integration/deploy/check_status_page.py: well-formed HTML without script
// or external asset, the figures in its table, and, with Chromium installed, headless Chromium's
// DOM and screenshot (kept as build/artifacts/status_page/status_page.png).

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier {
namespace {

using testing::BuiltProgram;
using testing::DaemonProcess;
using testing::RunProgram;
using testing::SimWorker;
using testing::SimWorkerOptions;

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// The operator's view as kvtierctl prints it (this test's uid is the daemon's: an operator).
nlohmann::json OperatorStatus(const DaemonProcess& d) {
  const testing::RunResult seqs =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", d.socket_path(), "--json", "sequences"});
  EXPECT_EQ(seqs.exit_code, 0) << seqs.output;
  const testing::RunResult workers =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", d.socket_path(), "--json", "workers"});
  EXPECT_EQ(workers.exit_code, 0) << workers.output;
  nlohmann::json status = nlohmann::json::parse(seqs.output, nullptr, false);
  const nlohmann::json w = nlohmann::json::parse(workers.output, nullptr, false);
  if (status.is_discarded() || w.is_discarded()) return {};
  status["worker_list"] = w["worker_list"];
  return status;
}

// A uint64 of the JSON (proto3's JSON writes them as strings).
uint64_t U64(const nlohmann::json& j) {
  return j.is_string() ? std::stoull(j.get<std::string>()) : j.get<uint64_t>();
}

// The line of `frame` whose first word is `id`, split into words ("" when there is none).
std::vector<std::string> Row(const std::string& frame, const std::string& id) {
  for (absl::string_view line : absl::StrSplit(frame, '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!words.empty() && words[0] == id) return words;
  }
  return {};
}

TEST(StatusPageTest, TopAndThePageShowTheDaemonsFigures) {
  absl::StatusOr<int> port = testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto daemon = DaemonProcess::Start({.metrics_address = absl::StrCat("127.0.0.1:", *port)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const DaemonProcess& d = **daemon;

  // Two workers: sequences tiered by snapshots, and one the daemon knows only from heartbeats.
  std::vector<std::unique_ptr<SimWorker>> workers;
  // The second reports its sequences' lost attention mass; the first does not.
  for (uint64_t seed : {7, 8}) {
    auto w = SimWorker::Connect({.address = d.address(),
                                 .name = "<b>tenant</b>",
                                 .seed = seed,
                                 .report_lost_mass = seed == 8});
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  for (auto& w : workers) {
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<int> seq = w->Open();
      ASSERT_TRUE(seq.ok()) << seq.status();
      for (int step = 0; step < 4; ++step) ASSERT_TRUE(w->Step(*seq, 96).ok());
    }
  }
  absl::StatusOr<int> quiet = workers[0]->Open();
  ASSERT_TRUE(quiet.ok());
  const uint64_t quiet_id = workers[0]->sequence_id(*quiet);
  workers[0]->client().ReportSequenceLength(quiet_id, 40);
  ASSERT_TRUE(workers[0]->client().HeartbeatOnce().ok());

  const nlohmann::json status = OperatorStatus(d);
  ASSERT_EQ(status["sequence_list"].size(), 5u) << status.dump();
  int with_lost_mass = 0;
  for (const auto& s : status["sequence_list"]) {
    if (U64(s["sequence_id"]) == quiet_id) {
      EXPECT_EQ(U64(s["length"]), 40u) << "learnt from a heartbeat, before any plan";
      EXPECT_EQ(U64(s["report"]["tokens_t0"]), 40u);
    }
    with_lost_mass += s.contains("lost_mass");
  }
  EXPECT_EQ(with_lost_mass, 2) << "the second worker's two sequences: " << status.dump();

  // kvtierctl top --once: a row per worker and sequence with the daemon's figures.
  const testing::RunResult top =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", d.socket_path(), "top", "--once"});
  ASSERT_EQ(top.exit_code, 0) << top.output;
  EXPECT_FALSE(absl::StrContains(top.output, "\x1b[")) << "--once prints no escapes";
  for (const auto& s : status["sequence_list"]) {
    const std::vector<std::string> row = Row(top.output, absl::StrCat("s", U64(s["sequence_id"])));
    ASSERT_GE(row.size(), 8u) << top.output;
    // s<ID>  <tag> (<policy>)  TOKENS  HBM-SAVED (two words)  T0  T1  T2  T3 ...
    EXPECT_EQ(row[3], absl::StrCat(U64(s["length"]))) << top.output;
    EXPECT_EQ(row[6], absl::StrCat(U64(s["report"]["tokens_t0"]))) << top.output;
    EXPECT_EQ(row[7], absl::StrCat(U64(s["report"]["tokens_t1"]))) << top.output;
    if (s.contains("lost_mass")) {
      const std::string cell =
          absl::StrFormat("%.2f%% (peak %.2f%%)", 100 * s["lost_mass"]["total"].get<double>(),
                          100 * s["lost_mass"]["peak_total"].get<double>());
      EXPECT_TRUE(absl::StrContains(top.output, cell)) << cell << "\n" << top.output;
    }
  }
  for (const auto& w : status["worker_list"]) {
    EXPECT_FALSE(Row(top.output, absl::StrCat("w", U64(w["worker_id"]))).empty()) << top.output;
  }
  EXPECT_TRUE(absl::StrContains(top.output, "<b>tenant</b>")) << "operators see worker names";

  // The page, as served and as a browser sees it.
  absl::StatusOr<testing::HttpResponse> page = testing::HttpGet(*port, "/");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->status, 200) << page->body;
  EXPECT_FALSE(absl::StrContains(page->body, "<b>tenant")) << "names are left out, never raw";
  absl::StatusOr<testing::HttpResponse> missing = testing::HttpGet(*port, "/nothing");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  absl::StatusOr<testing::HttpResponse> metrics = testing::HttpGet(*port, "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(absl::StrContains(metrics->body, "kvtier_hbm_saved_bytes")) << "/metrics still";

  const std::string dir = absl::StrCat(Env("KVTIER_BUILD_DIR", "."), "/artifacts/status_page");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/status_page.html") << page->body;
  std::ofstream(dir + "/status.json") << status.dump(2);
  const testing::RunResult check =
      RunProgram({"/usr/bin/env", "python3",
                  absl::StrCat(Env("KVTIER_SOURCE_DIR", "."),
                               "/tests/integration/deploy/check_status_page.py"),
                  dir + "/status_page.html", dir + "/status.json",
                  absl::StrCat("http://127.0.0.1:", *port, "/"), dir},
                 absl::Seconds(240));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  std::printf("%s", check.output.c_str());
}

}  // namespace
}  // namespace kvtier
