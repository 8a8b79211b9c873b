#include "bench/chaos/soak.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

constexpr int kCorrupted = 3, kStepErrors = 4;
constexpr uint64_t kMaxLength = 1024;  // a sequence this long is closed and a new one opened

volatile sig_atomic_t stop_worker = 0;
void OnTerm(int) { stop_worker = 1; }

// One worker process: `sequences` sequences stepped round robin, one step every `step`; a
// sequence past kMaxLength is closed and replaced (churn, so a leak per sequence would show).
// On SIGTERM it closes everything and exits: 0, kCorrupted, or kStepErrors when a step failed.
[[noreturn]] void SoakWorker(const std::string& address, int sequences, uint64_t seed,
                             absl::Duration step) {
  signal(SIGTERM, OnTerm);
  std::mt19937_64 rng(seed);
  SimWorkerOptions o;
  o.address = address;
  o.seed = seed;
  auto w = SimWorker::Connect(o);
  if (!w.ok()) {
    std::fprintf(stderr, "soak worker %d: connect: %s\n", getpid(), w.status().ToString().c_str());
    _exit(kStepErrors);
  }
  std::vector<int> seqs;
  std::vector<uint64_t> length;
  bool errors = false;
  for (int i = 0; i < sequences; ++i) {
    absl::StatusOr<int> s = (*w)->Open();
    if (!s.ok()) {
      std::fprintf(stderr, "soak worker %d: open: %s\n", getpid(), s.status().ToString().c_str());
      _exit(kStepErrors);
    }
    seqs.push_back(*s);
    length.push_back(0);
  }
  absl::Time next = absl::Now();
  for (size_t n = 0; !stop_worker; ++n) {
    const size_t k = n % seqs.size();
    // A fresh sequence starts with its prompt (SimWorkerOptions::prompt_tokens = 64).
    const uint64_t tokens = length[k] == 0 ? 64 + rng() % 33 : 16 + rng() % 33;
    absl::Status s = (*w)->Step(seqs[k], tokens);
    if (s.code() == absl::StatusCode::kInternal) {
      std::fprintf(stderr, "soak worker %d: %s\n", getpid(), std::string(s.message()).c_str());
      _exit(kCorrupted);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "soak worker %d: step: %s\n", getpid(), s.ToString().c_str());
      errors = true;
    }
    length[k] += tokens;
    if (length[k] > kMaxLength || !s.ok()) {
      (void)(*w)->Close(seqs[k]);
      absl::StatusOr<int> fresh = (*w)->Open();
      if (!fresh.ok()) {
        std::fprintf(stderr, "soak worker %d: reopen: %s\n", getpid(),
                     fresh.status().ToString().c_str());
        _exit(kStepErrors);
      }
      seqs[k] = *fresh;
      length[k] = 0;
    }
    next += step;
    absl::SleepFor(next - absl::Now());
  }
  for (int i : seqs) {
    if (absl::Status s = (*w)->Close(i); !s.ok()) {
      std::fprintf(stderr, "soak worker %d: close: %s\n", getpid(), s.ToString().c_str());
      errors = true;
    }
  }
  w->reset();  // CloseWorker
  _exit(errors ? kStepErrors : 0);
}

double RssMiB(pid_t pid) { return ResidentBytes(pid) / 1048576.0; }

// Lines of `text` that report an error: the daemon's ERROR level, anything a worker printed.
std::vector<std::string> ErrorLines(const std::string& text, bool every_line) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (every_line || absl::StrContains(line, " ERROR ")) out.emplace_back(line);
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int RunSoak(const SoakOptions& o) {
  const int port = *FreeLoopbackPort();
  const std::string dir = absl::StrCat("/tmp/kvtier-soak-", getpid());
  if (std::system(("mkdir -p " + dir).c_str()) != 0) return 2;
  DaemonProcess::Options d;
  d.socket_path = dir + "/kvtierd.sock";
  d.metrics_address = absl::StrCat("127.0.0.1:", port);
  d.ddr_mib = 1024;
  d.compressed_mib = 512;
  d.config_text =
      "[server]\nreap_interval_ms = 100\n[leases]\nttl_ms = 5000\nheartbeat_ms = 1000\n";
  auto daemon = DaemonProcess::Start(d);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvtier-chaos --soak: %s\n",
                 std::string(daemon.status().message()).c_str());
    return 2;
  }
  std::vector<pid_t> workers;
  for (int i = 0; i < o.workers; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(absl::StrCat(dir, "/worker-", i, ".log").c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      SoakWorker("unix:" + d.socket_path, o.sequences, o.seed + i, absl::Milliseconds(50));
    }
    workers.push_back(pid);
  }
  const absl::Time start = absl::Now();
  const double first_minute = std::min(60.0, o.seconds / 10.0);
  double rss_at_minute = 0, rss_max_after = 0, rss_last = 0;
  std::printf("kvtier-chaos --soak: %d workers x %d sequences, %d s, seed %llu\n", o.workers,
              o.sequences, o.seconds, static_cast<unsigned long long>(o.seed));
  std::printf("| t s | daemon RSS MiB | workers | sequences | DDR used MiB | plans |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const auto row = [&](double t, double rss) {
    std::printf("| %.0f | %.1f | %.0f | %.0f | %.1f | %.0f |\n", t, rss,
                ScrapeMetric(port, "kvtier_registry_workers"),
                ScrapeMetric(port, "kvtier_registry_sequences"),
                ScrapeMetric(port, "kvtier_pool_used_bytes{tier=\"T1\"}") / 1048576.0,
                ScrapeMetric(port, "kvtier_snapshots_total"));
    std::fflush(stdout);
  };
  int next_row = 0;
  for (;;) {
    const double t = absl::ToDoubleSeconds(absl::Now() - start);
    if (t >= o.seconds) break;
    const double rss = RssMiB((*daemon)->pid());
    if (t >= first_minute) {
      if (rss_at_minute == 0) rss_at_minute = rss;
      rss_max_after = std::max(rss_max_after, rss);
    }
    rss_last = rss;
    if (t >= next_row) {
      row(t, rss);
      next_row += o.sample_seconds;
    }
    absl::SleepFor(absl::Seconds(1));
  }
  row(o.seconds, rss_last);
  const double plans = ScrapeMetric(port, "kvtier_snapshots_total");
  for (pid_t pid : workers) kill(pid, SIGTERM);
  int failed_workers = 0;
  for (pid_t pid : workers) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed_workers += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  absl::SleepFor(absl::Milliseconds(500));  // the reaper's next pass, the gauges' update
  const double left_workers = ScrapeMetric(port, "kvtier_registry_workers");
  const double left_sequences = ScrapeMetric(port, "kvtier_registry_sequences");
  const double left_used = ScrapeMetric(port, "kvtier_pool_used_bytes");
  const double left_slots = ScrapeMetric(port, "kvtier_pool_used_slots");
  const double left_reserved = ScrapeMetric(port, "kvtier_pool_reserved_bytes");
  const double expirations = ScrapeMetric(port, "kvtier_lease_expirations_total");
  std::vector<std::string> errors = ErrorLines((*daemon)->Log(), false);
  for (int i = 0; i < o.workers; ++i) {
    for (std::string& line : ErrorLines(ReadAll(absl::StrCat(dir, "/worker-", i, ".log")), true)) {
      errors.push_back(std::move(line));
    }
  }
  const double growth = rss_at_minute > 0 ? rss_last / rss_at_minute - 1 : 0;
  const double growth_max = rss_at_minute > 0 ? rss_max_after / rss_at_minute - 1 : 0;
  const bool accounting = left_workers == 0 && left_sequences == 0 && left_used == 0 &&
                          left_slots == 0 && left_reserved == 0;
  const bool ok = accounting && errors.empty() && failed_workers == 0 && plans > 0 &&
                  growth_max <= o.max_rss_growth && expirations == 0;
  std::printf("\n| check | figure | target |\n|---|---|---|\n");
  std::printf(
      "| daemon RSS after %.0f s -> at the end (max) | %.1f -> %.1f MiB (%.1f MiB): %+.1f%% "
      "(max %+.1f%%) | <= %+.0f%% |\n",
      first_minute, rss_at_minute, rss_last, rss_max_after, 100 * growth, 100 * growth_max,
      100 * o.max_rss_growth);
  std::printf(
      "| left after every worker closed: workers, sequences, slots, slot bytes, extent bytes | "
      "%.0f, %.0f, %.0f, %.0f B, %.0f B | 0 |\n",
      left_workers, left_sequences, left_slots, left_used, left_reserved);
  std::printf(
      "| error lines (daemon log, worker stderr); workers failed; leases expired | "
      "%zu; %d; %.0f | 0 |\n",
      errors.size(), failed_workers, expirations);
  std::printf("| plans served | %.0f (%.0f/s) | > 0 |\n", plans, plans / o.seconds);
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) {
    std::printf("error: %s\n", errors[i].c_str());
  }
  std::printf("result: %s\n", ok ? "PASS" : "FAIL");
  (*daemon)->Stop(SIGTERM);
  return ok ? 0 : 1;
}

}  // namespace kvtier::testing
