// The real Prometheus server scrapes the real kvtierd, configured by deploy/prometheus.yml, while
// worker processes run sequences through the client library; then every PromQL expression of
// dashboards/kvtier.json is evaluated through Prometheus's HTTP API and must return data.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::FreeLoopbackPort;
using testing::HttpGet;
using testing::SimWorker;
using testing::SimWorkerOptions;
using testing::UrlEncode;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr int kWorkers = 3;

std::string SourceDir() {
  const char* dir = std::getenv("KVTIER_SOURCE_DIR");
  return dir ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// deploy/prometheus.yml, pointed at the test daemon and scraping every second. Each edit must
// find its text, so the test notices when the shipped file changes shape.
absl::StatusOr<std::string> ScrapeConfig(int metrics_port) {
  std::string text = ReadFile(SourceDir() + "/deploy/prometheus.yml");
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"\"127.0.0.1:9464\"", absl::StrCat("\"127.0.0.1:", metrics_port, "\"")},
      {"  scrape_interval: 15s", "  scrape_interval: 1s"},
      {"  evaluation_interval: 15s", "  evaluation_interval: 1s"},
      {"    scrape_interval: 5s", "    scrape_interval: 1s"},
      {"    scrape_timeout: 4s", "    scrape_timeout: 1s"}};
  for (const auto& [from, to] : edits) {
    if (text.find(from) == std::string::npos) {
      return absl::NotFoundError(absl::StrCat("deploy/prometheus.yml has no `", from, "`"));
    }
    absl::StrReplaceAll({{from, to}}, &text);
  }
  return text;
}

// A background program with its output in a file; SIGTERM and reaped on destruction.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log)
      : pid_(testing::SpawnProgram(argv, log)) {}
  ~Child() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_;
};

// The workload of one worker process: two sequences grown 64 tokens per step, one of them
// closed at the end, the other left open; worker 0 also sends bad requests (errors by code). Writes
// a byte to `ready_fd` when done, then waits to be killed.
void RunWorker(const std::string& address, int index, int ready_fd) {
  SimWorkerOptions options{.address = address, .seed = static_cast<uint64_t>(index + 11)};
  options.name = absl::StrCat("scrape-", index);
  auto worker = SimWorker::Connect(options);
  absl::Status status = worker.status();
  std::vector<int> ids;
  for (int s = 0; status.ok() && s < 2; ++s) {
    auto id = (*worker)->Open();
    status = id.status();
    if (id.ok()) ids.push_back(*id);
  }
  // Worker 0 sends a bad request at the start and at the end: the errors series appears on first
  // use, so only the second one shows in rate().
  auto bad_request = [&] {
    if (!status.ok() || index != 0) return;
    absl::Status bad = (*worker)->client().AckPlan(987654321, 1, true);
    if (bad.ok()) status = absl::InternalError("AckPlan of an unknown sequence succeeded");
  };
  bad_request();
  const absl::Time end = absl::Now() + absl::Seconds(4);
  for (int step = 0; status.ok() && step < 40 && absl::Now() < end; ++step) {
    for (int id : ids) {
      if (status.ok()) status = (*worker)->Step(id, 64);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  bad_request();
  if (status.ok()) status = (*worker)->Close(ids.front());
  if (!status.ok()) std::fprintf(stderr, "worker %d: %s\n", index, status.ToString().c_str());
  char c = status.ok() ? 1 : 0;
  (void)!write(ready_fd, &c, 1);
  pause();
  _exit(0);
}

// Kills and reaps the worker processes however the test ends.
struct Processes {
  ~Processes() {
    for (pid_t pid : pids) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  std::vector<pid_t> pids;
};

// A worker that registers, plans once and vanishes without closing: its lease expires.
void RunLostWorker(const std::string& address) {
  SimWorkerOptions options{.address = address, .name = "lost", .seed = 99};
  options.background_heartbeat = false;
  auto worker = SimWorker::Connect(options);
  if (!worker.ok()) _exit(1);
  auto id = (*worker)->Open();
  _exit(id.ok() && (*worker)->Step(*id, 256).ok() ? 0 : 1);
}

absl::StatusOr<nlohmann::json> Query(int port, const std::string& promql) {
  auto r = HttpGet(port, "/api/v1/query?query=" + UrlEncode(promql));
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::InternalError(absl::StrCat("HTTP ", r->status, ": ", r->body));
  }
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success") {
    return absl::InternalError(absl::StrCat("bad answer: ", r->body));
  }
  return j.at("data").at("result");
}

// The first sample's value of a query, or NaN when there is none.
double Scalar(int port, const std::string& promql) {
  auto result = Query(port, promql);
  if (!result.ok() || result->empty()) return std::nan("");
  return std::stod((*result)[0].at("value")[1].get<std::string>());
}

bool WaitUntil(absl::Duration timeout, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return done();
}

// Dashboard expressions with Grafana's variables bound as a dashboard would bind them.
std::vector<std::string> DashboardExpressions() {
  nlohmann::json dashboard =
      nlohmann::json::parse(ReadFile(SourceDir() + "/dashboards/kvtier.json"));
  std::vector<std::string> exprs;
  for (const auto& p : dashboard.at("panels")) {
    for (const auto& t : p.value("targets", nlohmann::json::array())) {
      exprs.push_back(absl::StrReplaceAll(t.at("expr").get<std::string>(),
                                          {{"$__rate_interval", "1m"}, {"$instance", ".+"}}));
    }
  }
  return exprs;
}

TEST(PrometheusScrapeTest, EveryDashboardExpressionReturnsDataFromARealScrape) {
  ASSERT_TRUE(std::filesystem::exists(kPrometheus))
      << kPrometheus << " missing: install the Debian prometheus package (scripts/install-deps)";
  auto metrics_port = FreeLoopbackPort();
  auto web_port = FreeLoopbackPort();
  ASSERT_TRUE(metrics_port.ok() && web_port.ok());
  auto daemon =
      DaemonProcess::Start({.config_text = "[leases]\nttl_ms = 1000\nheartbeat_ms = 200\n"
                                           "[server]\nreap_interval_ms = 100\n",
                            .metrics_address = absl::StrCat("127.0.0.1:", *metrics_port)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();

  const std::string dir = (*daemon)->dir();
  auto config = ScrapeConfig(*metrics_port);
  ASSERT_TRUE(config.ok()) << config.status();
  std::ofstream(dir + "/prometheus.yml") << *config;
  // The alert rules prometheus.yml loads from beside it: the server evaluates them too.
  std::ofstream(dir + "/kvtier-alerts.yml") << ReadFile(SourceDir() + "/deploy/kvtier-alerts.yml");
  const std::string prometheus_log = dir + "/prometheus.log";
  auto prometheus = std::make_unique<Child>(
      std::vector<std::string>{kPrometheus, "--config.file=" + dir + "/prometheus.yml",
                               "--storage.tsdb.path=" + dir + "/tsdb",
                               absl::StrCat("--web.listen-address=127.0.0.1:", *web_port),
                               "--log.level=warn"},
      prometheus_log);
  ASSERT_TRUE(WaitUntil(absl::Seconds(20),
                        [&] {
                          auto r = HttpGet(*web_port, "/-/ready");
                          return r.ok() && r->status == 200;
                        }))
      << "Prometheus did not become ready:\n"
      << ReadFile(prometheus_log);

  // Prometheus applies scrape targets a few seconds after it is ready: start the workload only
  // once it scrapes, so the rate() panels see counters move.
  ASSERT_TRUE(
      WaitUntil(absl::Seconds(20), [&] { return Scalar(*web_port, "up{job=\"kvtierd\"}") == 1; }))
      << "Prometheus does not scrape kvtierd:\n"
      << ReadFile(prometheus_log);

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  Processes workers;
  for (int w = 0; w < kWorkers; ++w) {
    pid_t pid = fork();
    if (pid == 0) RunWorker(address, w, ready[1]);
    workers.pids.push_back(pid);
  }
  pid_t lost = fork();
  if (lost == 0) RunLostWorker(address);
  close(ready[1]);  // a worker that dies without reporting ends the read below
  int ok_workers = 0;
  for (int w = 0; w < kWorkers; ++w) {
    char c = 0;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    ok_workers += c;
  }
  int lost_status = 0;
  waitpid(lost, &lost_status, 0);
  EXPECT_EQ(ok_workers, kWorkers) << (*daemon)->Log();
  EXPECT_TRUE(WIFEXITED(lost_status) && WEXITSTATUS(lost_status) == 0);

  // Until Prometheus has scraped the end state: the lost worker reaped, the others registered.
  EXPECT_TRUE(WaitUntil(absl::Seconds(20),
                        [&] {
                          return Scalar(*web_port, "kvtier_lease_expirations_total") >= 1 &&
                                 Scalar(*web_port, "kvtier_registry_workers") == kWorkers;
                        }))
      << "Prometheus never saw the workload; up = " << Scalar(*web_port, "up{job=\"kvtierd\"}")
      << "\n"
      << ReadFile(prometheus_log) << (*daemon)->Log();
  EXPECT_EQ(Scalar(*web_port, "up{job=\"kvtierd\"}"), 1);
  EXPECT_GT(Scalar(*web_port, "kvtier_snapshots_total"), kWorkers * 2);
  absl::SleepFor(absl::Seconds(2));  // a few more samples for rate() windows

  const std::vector<std::string> exprs = DashboardExpressions();
  ASSERT_GE(exprs.size(), 10u);
  for (const std::string& expr : exprs) {
    auto result = Query(*web_port, expr);
    ASSERT_TRUE(result.ok()) << expr << ": " << result.status();
    EXPECT_FALSE(result->empty()) << "no data: " << expr;
    if (!result->empty()) {
      std::printf("%-14s %s\n", (*result)[0].at("value")[1].get<std::string>().c_str(),
                  expr.c_str());
    }
  }
  // The workload ran while Prometheus scraped: the flow panels show it moving.
  for (const char* moving :
       {"sum(rate(kvtier_snapshots_total[1m]))", "sum(rate(kvtier_plan_moved_bytes_total[1m]))",
        "histogram_quantile(0.99, sum by (le) (rate(kvtier_plan_latency_seconds_bucket[1m])))",
        "sum(increase(kvtier_lease_expirations_total[1m]))",
        "sum(rate(kvtier_rpc_errors_total{code=\"not_found\"}[1m]))"}) {
    const double v = Scalar(*web_port, moving);
    EXPECT_TRUE(std::isfinite(v) && v > 0) << moving << " = " << v;
  }
  auto instances = HttpGet(
      *web_port, "/api/v1/label/instance/values?match[]=" + UrlEncode("kvtier_registry_workers"));
  ASSERT_TRUE(instances.ok());
  EXPECT_NE(instances->body.find(absl::StrCat("127.0.0.1:", *metrics_port)), std::string::npos)
      << "the dashboard's $instance variable would be empty: " << instances->body;
  // deploy/kvtier-alerts.yml loaded and evaluated against the real daemon's series.
  auto rules = HttpGet(*web_port, "/api/v1/rules");
  ASSERT_TRUE(rules.ok());
  EXPECT_NE(rules->body.find("KvtierLostAttentionMassHigh"), std::string::npos) << rules->body;
  EXPECT_EQ(rules->body.find("\"health\":\"err\""), std::string::npos) << rules->body;
}

}  // namespace
}  // namespace kvtier
