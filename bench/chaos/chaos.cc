// kvtier-chaos: faults at random moments against a real kvtierd and real worker processes, and
// the figures that say whether anything leaked, hung or broke.
//
// Workers are SimWorker processes (two sequences each) that write a per-page pattern into every
// slot a plan grants and check all of it after every plan: a slot shared, freed early or lost
// shows up as a verification failure, which the worker reports by exiting with code 3. Faults:
// worker kill -9 (respawned), daemon SIGSTOP past the RPC deadline or past the lease, daemon kill
// -9 and restart, SIGHUP reloads that change leases and per-worker limits mid-run, a client that
// sends requests and stops reading (bench/chaos/stuck_client.h), the pools' tmpfs filling up
// (bench/chaos/full_tmpfs.h). Figures come from the daemon's /metrics and log, and from what the
// workers report over pipes (this process never speaks gRPC, so it can fork).
//
//   kvtier-chaos [--workers 6] [--kills 20] [--stalls 2] [--restarts 1] [--reloads 0]
//                [--lease-stalls 0] [--stuck-clients 0] [--full-tmpfs 0] [--ttl-ms 1000]
//   kvtier-chaos --soak 600 [--workers 32] [--sequences 8]   (no faults: bench/chaos/soak.h)

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/chaos/chaos_options.h"
#include "bench/chaos/full_tmpfs.h"
#include "bench/chaos/soak.h"
#include "bench/chaos/stuck_client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

// A worker process that reports its SimProgress over a pipe: its pid and the pipe's read end
// (both ends non-blocking: a worker never waits for this process to read).
std::pair<pid_t, int> SpawnWorker(const std::string& address, uint64_t seed) {
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return {-1, -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    RunSimWorkerProcess(address, seed, p[1]);
  }
  close(p[1]);
  return {pid, p[0]};
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// The daemon's config at lease TTL `ttl_ms`; `tight` adds per-worker limits a reload imposes on
// workers already running (one sequence each, a 1 MiB DDR quota: plans degrade, nothing fails).
// `extent_dir` non-empty: the pools' extents live there, 1 MiB each (so that the pools grow in
// small steps all the time and a full directory is felt at once).
std::string ChaosConfig(const ChaosOptions& o, int ttl_ms, bool tight,
                        const std::string& extent_dir) {
  return absl::StrCat(
      extent_dir.empty() ? "" : absl::StrCat("extent_dir = \"", extent_dir, "\"\nextent_mib = 1\n"),
      "[server]\nreap_interval_ms = 50\nunread_timeout_ms = ", o.unread_timeout_ms,
      "\n[leases]\nttl_ms = ", ttl_ms, "\nheartbeat_ms = ", std::max(10, ttl_ms / 5), "\n",
      tight ? "[limits]\nmax_sequences_per_worker = 1\nworker_ddr_quota_mib = 1\n" : "");
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

double MiB(uint64_t bytes) { return bytes / 1048576.0; }

// What the stuck-client and full-tmpfs faults measured, over every time they were injected.
struct NewFaultFigures {
  std::vector<StuckClientFigures> stuck;
  double stuck_seconds = 0;   // spent with a stuck client connected
  std::string tmpfs_not_run;  // why the tmpfs fault could not be injected ("" = it was)
  uint64_t tmpfs_bytes = 0;
  struct Full {
    uint64_t cannot_grow = 0;  // plans the workers got degraded because a pool could not grow
    uint64_t grown = 0;        // plans after which a worker had mapped more extents
    double failures = 0;       // kvtier_pool_allocation_failures_total meanwhile
    double plans = 0;
    double back_ms = -1;  // from the room's return to a worker's next new extent; -1: none in 5 s
    double felt_ms = -1;  // from the fill to the first plan that said the pool cannot grow
  };
  std::vector<Full> full;
};

// Rows for the two faults; false when a target was missed.
bool PrintNewFaultRows(const ChaosOptions& o, const NewFaultFigures& f, double run_seconds,
                       double plans) {
  bool ok = true;
  if (o.stuck_clients == 0) {
    std::printf("| a client that stops reading | not asked for (--stuck-clients 0) | - |\n");
  } else {
    std::vector<double> drop_ms;
    double fewest = -1;
    uint64_t rss0 = f.stuck.empty() ? 0 : f.stuck.front().rss_before, rss_max = rss0;
    uint64_t rss_first_half = rss0;  // max over the first half of the stuck clients
    double stuck_plans = 0;
    for (size_t i = 0; i < f.stuck.size(); ++i) {
      const StuckClientFigures& s = f.stuck[i];
      if (s.dropped) drop_ms.push_back(s.drop_ms);
      fewest = fewest < 0 ? s.plans : std::min(fewest, s.plans);
      rss_max = std::max(rss_max, s.rss_max);
      if (2 * i < f.stuck.size()) rss_first_half = rss_max;
      stuck_plans += s.plans;
    }
    const double limit = o.unread_timeout_ms + 1000.0;
    const double worst = drop_ms.empty() ? 0 : *std::max_element(drop_ms.begin(), drop_ms.end());
    // Bounded, as in stuck_client_test: at most 128 MiB in all, and the second half of the
    // stuck clients adds at most 32 MiB to the first half's peak (freed memory that malloc
    // keeps per thread is reused, a leak is not).
    const double growth = MiB(rss_max) - MiB(rss0);
    const double late_growth = MiB(rss_max) - MiB(rss_first_half);
    ok = drop_ms.size() == f.stuck.size() && worst <= limit && growth <= 128 && late_growth <= 32 &&
         fewest >= 1;
    std::printf(
        "| a client that sends 64 GetStatus every 20 ms over raw HTTP/2 and reads nothing: "
        "dropped by the daemon (its log names the pid); from its start, p50 / max | %zu of %zu; "
        "%.0f / %.0f ms | all; <= server.unread_timeout_ms + 1 s = %.0f ms |\n",
        drop_ms.size(), f.stuck.size(), Percentile(drop_ms, 0.5), worst, limit);
    std::printf(
        "| daemon RSS while the stuck clients ran: before the first; max over the first half of "
        "them; max over all | %.1f; %.1f; %.1f MiB (%+.1f in all, %+.1f in the second half) | "
        "<= +128 MiB in all, <= +32 MiB in the second half |\n",
        MiB(rss0), MiB(rss_first_half), MiB(rss_max), growth, late_growth);
    std::printf(
        "| plans while a stuck client was connected: fewest in one; rate then vs the whole run "
        "| %.0f; %.0f/s vs %.0f/s | >= 1 each time |\n",
        fewest, f.stuck_seconds > 0 ? stuck_plans / f.stuck_seconds : 0, plans / run_seconds);
  }
  if (o.full_tmpfs == 0) {
    std::printf("| a full tmpfs | not asked for (--full-tmpfs 0) | - |\n");
  } else if (!f.tmpfs_not_run.empty()) {
    std::printf("| a full tmpfs | not run: %s | - |\n", f.tmpfs_not_run.c_str());
  } else {
    uint64_t cannot_grow = 0, grown = 0, fewest = UINT64_MAX;
    double failures = 0, plans_full = 0;
    std::vector<double> back, felt;
    for (const NewFaultFigures::Full& w : f.full) {
      if (w.felt_ms >= 0) felt.push_back(w.felt_ms);
      cannot_grow += w.cannot_grow;
      grown += w.grown;
      failures += w.failures;
      plans_full += w.plans;
      fewest = std::min(fewest, w.cannot_grow);
      if (w.back_ms >= 0) back.push_back(w.back_ms);
    }
    if (f.full.empty()) fewest = 0;
    ok &= fewest >= 1 && felt.size() == f.full.size() && back.size() == f.full.size();
    std::printf(
        "| the first plan saying the pool cannot grow, after the fill: p50 / max (the tmpfs stays "
        "full until then, up to 10 s) | %zu of %zu; %.0f / %.0f ms | all |\n",
        felt.size(), f.full.size(), Percentile(felt, 0.5),
        felt.empty() ? 0 : *std::max_element(felt.begin(), felt.end()));
    std::printf(
        "| the pools' tmpfs (%.0f MiB, pools.extent_dir, 1 MiB extents) kept full for at least %d "
        "ms "
        "at the "
        "starting config: "
        "max(3, W / 2) workers replaced at its start; plans degraded saying the pool cannot grow; "
        "fewest in "
        "one window; allocation failures; plans after which a worker had more extents (spares "
        "made before); plans | %zu windows: %llu; %llu; %.0f; %llu; %.0f | >= 1 in every window "
        "|\n",
        MiB(f.tmpfs_bytes), o.full_ms, f.full.size(), static_cast<unsigned long long>(cannot_grow),
        static_cast<unsigned long long>(fewest), failures, static_cast<unsigned long long>(grown),
        plans_full);
    std::printf(
        "| room back: a worker maps a new extent, p50 / max after the filler went | %zu of %zu; "
        "%.0f / %.0f ms | all, <= 5000 ms |\n",
        back.size(), f.full.size(), Percentile(back, 0.5),
        back.empty() ? 0 : *std::max_element(back.begin(), back.end()));
  }
  return ok;
}

// One run of the fault harness: the daemon, the workers it forks, and the counts each fault
// leaves behind. Not thread-safe: main's thread drives it.
class ChaosRun {
 public:
  explicit ChaosRun(const ChaosOptions& o) : o_(o), rng_(o.seed), ttl_now_(o.ttl_ms) {}

  // 0: every check passed; 1: a check failed; 2: the run could not be set up.
  int Run() {
    if (!Start()) return 2;
    for (char f : FaultPlan()) {
      absl::SleepFor(absl::Milliseconds(100 + rng_() % 300));
      ReapChildren();
      if (!Inject(f)) return 2;
    }
    if (ttl_now_ != o_.ttl_ms) Reload();  // back to the starting lease for the final checks
    absl::SleepFor(absl::Seconds(1));
    ReapChildren();
    const bool ok = Report();
    (*daemon_)->Stop(SIGTERM);
    for (auto& [pid, w] : workers_) close(w.fd);
    while (waitpid(-1, nullptr, 0) > 0) {
    }
    return ok ? 0 : 1;
  }

 private:
  struct Worker {
    bool killed = false;  // by us
    absl::Time spawned;
    int fd = -1;  // its progress pipe
    SimProgress last;
  };

  bool Start() {
    port_ = *FreeLoopbackPort();
    const std::string dir = "/tmp/kvtier-chaos-" + std::to_string(getpid());
    if (std::system(("mkdir -p " + dir).c_str()) != 0) return false;
    sock_ = dir + "/kvtierd.sock";
    d_.socket_path = sock_;
    d_.metrics_address = absl::StrCat("127.0.0.1:", port_);
    if (o_.full_tmpfs > 0) {
      // kvtierd refuses pools.extent_dir since extents there cannot be sealed (a worker could
      // grow its own and fill the tmpfs for everyone); a pool that cannot grow is checked by
      // pool_exhaustion_test (a file-size limit) instead.
      nf_.tmpfs_not_run =
          "pools.extent_dir is refused by kvtierd (unsealable extents); see pool_exhaustion_test";
    }
    extent_dir_ = tmpfs_ ? tmpfs_->dir() : "";
    d_.config_text = ChaosConfig(o_, o_.ttl_ms, false, extent_dir_);
    daemon_ = DaemonProcess::Start(d_);
    if (!daemon_.ok()) {
      std::fprintf(stderr, "kvtier-chaos: %s\n", std::string(daemon_.status().message()).c_str());
      return false;
    }
    for (int i = 0; i < o_.workers; ++i) Spawn();
    absl::SleepFor(absl::Seconds(1));
    run_start_ = absl::Now();
    return true;
  }

  // The faults, in random order.
  std::vector<char> FaultPlan() {
    std::vector<char> faults;
    faults.insert(faults.end(), o_.kills, 'k');
    faults.insert(faults.end(), o_.stalls, 's');
    faults.insert(faults.end(), o_.restarts, 'r');
    faults.insert(faults.end(), o_.reloads, 'h');
    faults.insert(faults.end(), o_.lease_stalls, 'l');
    faults.insert(faults.end(), o_.stuck_clients, 'c');
    if (tmpfs_) faults.insert(faults.end(), o_.full_tmpfs, 'f');
    std::shuffle(faults.begin(), faults.end(), rng_);
    return faults;
  }

  // False when the daemon could not be restarted.
  bool Inject(char f) {
    switch (f) {
      case 'k':
        KillWorker();
        return true;
      case 's':
        // Past the RPC deadline (200 ms), within the lease.
        (void)(*daemon_)->Signal(SIGSTOP);
        absl::SleepFor(absl::Milliseconds(std::min(600, ttl_now_ / 2)));
        (void)(*daemon_)->Signal(SIGCONT);
        ++stalls_;
        return true;
      case 'h':
        Reload();
        return true;
      case 'l':
        StallPastTheLease();
        return true;
      case 'c': {
        const absl::Time t0 = absl::Now();
        nf_.stuck.push_back(
            RunStuckClient(**daemon_, port_, absl::Milliseconds(o_.unread_timeout_ms + 5000)));
        nf_.stuck_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
        return true;
      }
      case 'f':
        FillTmpfs();
        return true;
      default:
        return RestartDaemon();
    }
  }

  void Spawn() {
    const auto [pid, fd] = SpawnWorker("unix:" + sock_, rng_());
    if (pid > 0) workers_[pid] = {false, absl::Now(), fd, {}};
  }

  static void Drain(Worker& w) {
    SimProgress p;
    while (read(w.fd, &p, sizeof(p)) == sizeof(p)) w.last = p;
  }

  // The workers' counts over the whole run.
  SimProgress Totals() {
    SimProgress t = retired_;
    for (auto& [pid, w] : workers_) {
      Drain(w);
      t.cannot_grow += w.last.cannot_grow;
      t.grown += w.last.grown;
    }
    return t;
  }

  double Metric(const char* name) const { return ScrapeMetric(port_, name); }

  // Reloads alternate between the doubled lease with tight limits and the starting config.
  void Reload() {
    const bool tight = ttl_now_ == o_.ttl_ms;
    const int before = Count((*daemon_)->Log(), "SIGHUP: reloaded");
    const int ttl = tight ? 2 * o_.ttl_ms : o_.ttl_ms;
    if (!(*daemon_)->RewriteConfig(ChaosConfig(o_, ttl, tight, extent_dir_)).ok()) return;
    (void)(*daemon_)->Signal(SIGHUP);
    ++reloads_;
    const absl::Time t0 = absl::Now();
    while (absl::Now() - t0 < absl::Seconds(5)) {
      if (Count((*daemon_)->Log(), "SIGHUP: reloaded") > before) {
        ++reloads_applied_;
        ttl_now_ = ttl;
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  void ReapChildren() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = workers_.find(pid);
      if (it == workers_.end()) continue;
      const bool ours = it->second.killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      if (!ours) {
        ++crashes_;
        corrupted_ += WIFEXITED(status) && WEXITSTATUS(status) == kSimCorrupted;
        std::fprintf(stderr, "worker %d died on its own (status %d)\n", pid, status);
      }
      Drain(it->second);
      retired_.cannot_grow += it->second.last.cannot_grow;
      retired_.grown += it->second.last.grown;
      close(it->second.fd);
      workers_.erase(it);
      if (respawn_) Spawn();
    }
  }

  // kill -9 one worker that has had time to register, mid-plan or not, and time until the
  // daemon reaps its lease.
  void KillWorker() {
    std::vector<pid_t> ready;
    for (const auto& [pid, w] : workers_) {
      if (absl::Now() - w.spawned > absl::Milliseconds(700)) ready.push_back(pid);
    }
    if (ready.empty()) return;
    auto it = workers_.find(ready[rng_() % ready.size()]);
    const double expired = Metric("kvtier_lease_expirations_total");
    it->second.killed = true;
    kill(it->first, SIGKILL);
    const absl::Time t0 = absl::Now();
    ++kills_;
    while (absl::Now() - t0 < absl::Milliseconds(ttl_now_ * 3)) {
      if (Metric("kvtier_lease_expirations_total") > expired) {
        reclaim_ms_.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        worst_over_ttl_ms_ = std::max(worst_over_ttl_ms_, reclaim_ms_.back() - ttl_now_);
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // Past the lease: every worker's lease lapses meanwhile; they must register again and tier on,
  // none may crash or see a page change.
  void StallPastTheLease() {
    const double expired = Metric("kvtier_lease_expirations_total");
    (void)(*daemon_)->Signal(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(ttl_now_ + 500));
    (void)(*daemon_)->Signal(SIGCONT);
    ++lease_stalls_;
    absl::SleepFor(absl::Seconds(2));
    stall_reaped_ += Metric("kvtier_lease_expirations_total") - expired;
    stall_back_ += Metric("kvtier_registry_workers");
  }

  bool RestartDaemon() {
    plans_before_ += Metric("kvtier_snapshots_total");  // the new daemon counts anew
    (*daemon_)->Stop(SIGKILL);
    daemon_ = DaemonProcess::Start(d_);
    if (!daemon_.ok()) {
      std::fprintf(stderr, "restart failed: %s\n", std::string(daemon_.status().message()).c_str());
      return false;
    }
    ++restarts_;
    ttl_now_ = o_.ttl_ms;  // the restarted daemon reads the starting config
    return true;
  }

  // The tmpfs kept full for --full-ms (extents come and go meanwhile), then the room given back.
  void FillTmpfs() {
    // At the starting config: a reload's 1 MiB per-worker quota would refuse slots before the
    // tmpfs does (the next reload imposes it again).
    if (ttl_now_ != o_.ttl_ms) Reload();
    NewFaultFigures::Full w;
    const SimProgress before = Totals();
    const double failures = Metric("kvtier_pool_allocation_failures_total");
    const double plans = Metric("kvtier_snapshots_total");
    // Workers replaced now need extents of their own while the tmpfs is full (the others hold
    // theirs by then), more than the two spares per pool made before; the room their
    // predecessors' extents free is filled again.
    const absl::Time t0 = absl::Now();
    (void)tmpfs_->Fill();
    int replace = std::min(o_.workers, std::max(3, o_.workers / 2));
    for (auto& [pid, worker] : workers_) {
      if (replace == 0) break;
      if (t0 - worker.spawned < absl::Milliseconds(700)) continue;
      worker.killed = true;
      kill(pid, SIGKILL);
      --replace;
    }
    // Full for --full-ms, and on until a plan says the pool cannot grow (up to 10 s): whether a
    // worker needs a new extent soon is up to its sequences.
    for (absl::Duration t; (t = absl::Now() - t0) < absl::Milliseconds(o_.full_ms) ||
                           (w.felt_ms < 0 && t < absl::Seconds(10));) {
      (void)tmpfs_->Fill();
      ReapChildren();
      if (w.felt_ms < 0 && Totals().cannot_grow > before.cannot_grow) {
        w.felt_ms = absl::ToDoubleMilliseconds(t);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    const SimProgress during = Totals();
    w.cannot_grow = during.cannot_grow - before.cannot_grow;
    w.grown = during.grown - before.grown;
    w.failures = Metric("kvtier_pool_allocation_failures_total") - failures;
    w.plans = Metric("kvtier_snapshots_total") - plans;
    tmpfs_->Drain();
    for (const absl::Time t1 = absl::Now(); absl::Now() - t1 < absl::Seconds(5);) {
      if (Totals().grown > during.grown) {
        w.back_ms = absl::ToDoubleMilliseconds(absl::Now() - t1);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    nf_.full.push_back(w);
  }

  // Ends every worker, waits TTL + 1 s and prints the table; true when every target was met.
  bool Report() {
    const double plans = plans_before_ + Metric("kvtier_snapshots_total");
    const double run_seconds = absl::ToDoubleSeconds(absl::Now() - run_start_);
    respawn_ = false;
    for (auto& [pid, w] : workers_) {
      w.killed = true;
      kill(pid, SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(ttl_now_ + 1000));
    ReapChildren();
    const double left_workers = Metric("kvtier_registry_workers");
    const double left_used = Metric("kvtier_pool_used_bytes");
    const double left_reserved = Metric("kvtier_pool_reserved_bytes");
    const double ttl1 = ttl_now_ + 1000;
    const double p99 = Percentile(reclaim_ms_, 0.99);
    const double max =
        reclaim_ms_.empty() ? 0 : *std::max_element(reclaim_ms_.begin(), reclaim_ms_.end());
    bool ok = left_workers == 0 && left_used == 0 && left_reserved == 0 && crashes_ == 0 &&
              worst_over_ttl_ms_ <= 1000 && (kills_ == 0 || !reclaim_ms_.empty()) &&
              reloads_applied_ == reloads_ && plans > 0;
    std::printf(
        "kvtier-chaos: %d workers, %d kills, %d daemon stalls, %d daemon restarts, %d reloads, "
        "%d stalls past the lease, %zu stuck clients, %zu full tmpfs windows, lease %d ms, "
        "seed %llu\n",
        o_.workers, kills_, stalls_, restarts_, reloads_, lease_stalls_, nf_.stuck.size(),
        nf_.full.size(), o_.ttl_ms, static_cast<unsigned long long>(o_.seed));
    std::printf("| check | figure | target |\n|---|---|---|\n");
    std::printf("| workers, slots and extents left after TTL + 1 s | %.0f, %.0f B, %.0f B | 0 |\n",
                left_workers, left_used, left_reserved);
    std::printf(
        "| reclaim after a kill -9: p50 / p99 / max | %.0f / %.0f / %.0f ms (measured for %zu of "
        "%d kills; a worker killed while connecting has no lease to reap) | <= %.0f ms%s |\n",
        Percentile(reclaim_ms_, 0.5), p99, max, reclaim_ms_.size(), kills_, ttl1,
        reloads_ > 0 ? " at the starting lease (next row)" : "");
    if (reloads_ > 0) {
      std::printf(
          "| reclaim beyond the lease in force (a reload doubles it) | worst %.0f ms | <= 1000 ms "
          "|\n",
          worst_over_ttl_ms_);
      std::printf(
          "| SIGHUP reloads applied mid-run (lease x2 with 1 sequence and 1 MiB DDR per worker, "
          "and back) | %d of %d | all |\n",
          reloads_applied_, reloads_);
    }
    if (lease_stalls_ > 0) {
      std::printf(
          "| daemon SIGSTOPped past the lease (TTL + 500 ms): leases reaped; workers registered 2 "
          "s later | %d stalls: %.0f reaped; %.0f of %d | - |\n",
          lease_stalls_, stall_reaped_, stall_back_, lease_stalls_ * o_.workers);
    }
    ok &= PrintNewFaultRows(o_, nf_, run_seconds, plans);
    std::printf(
        "| workers that died on their own (a page that lost its bytes: exit %d) | %d (%d with "
        "corrupted pages) | 0 |\n",
        kSimCorrupted, crashes_, corrupted_);
    std::printf("| plans served | %.0f | > 0 |\n", plans);
    std::printf("result: %s%s\n", ok ? "PASS" : "FAIL",
                nf_.tmpfs_not_run.empty() ? "" : " (a full tmpfs: not run)");
    return ok;
  }

  const ChaosOptions& o_;
  std::mt19937_64 rng_;
  int port_ = 0;
  std::string sock_, extent_dir_;
  DaemonProcess::Options d_;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon_;
  std::unique_ptr<FullTmpfs> tmpfs_;
  NewFaultFigures nf_;
  std::map<pid_t, Worker> workers_;
  SimProgress retired_;  // the counts of workers that ended
  bool respawn_ = true;
  absl::Time run_start_;
  std::vector<double> reclaim_ms_;
  double worst_over_ttl_ms_ = 0;  // reclaim minus the lease TTL in force, worst case
  int crashes_ = 0, kills_ = 0, stalls_ = 0, restarts_ = 0, corrupted_ = 0;
  int reloads_ = 0, reloads_applied_ = 0, lease_stalls_ = 0;
  double stall_reaped_ = 0, stall_back_ = 0;  // leases reaped by, workers registered after, them
  int ttl_now_;                               // a reload doubles it and the next one restores it
  double plans_before_ = 0;                   // served by the daemons a restart replaced
};

}  // namespace
}  // namespace kvtier::testing

int main(int argc, char** argv) {
  absl::StatusOr<kvtier::testing::ChaosOptions> o =
      kvtier::testing::ParseChaosOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!o.ok()) {
    std::fprintf(stderr, "kvtier-chaos: %s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  if (!o->help.empty()) {
    std::printf("%s", o->help.c_str());
    return 0;
  }
  return o->soak ? kvtier::testing::RunSoak(o->soak_options) : kvtier::testing::ChaosRun(*o).Run();
}
