// Snapshot -> plan round trips (latency: SubmitSnapshot alone; plans/s: snapshot + ack) over
// kvtierd's unix socket, with real worker clients.
//
// Open loop: W workers each offer one request every --period-ms, each from its own random
// phase; reports p50/p99 latency over --seconds after --warmup-seconds of the same load (a fresh
// sequence's first plans demote most of its pages at once: their p99 is the last column). Closed
// loop: the same workers send back to back; reports the rate. Each load is run three ways:
// GetStatus (an empty RPC over the same socket: the baseline, measured under the same load in the
// same run), 2K-page snapshots acknowledged with AckPlan (two round trips a plan), and snapshots
// carrying the acknowledgement of the sequence's previous plan (applied_plan_version: one round
// trip). Also reports the daemon's memory.
//
// Beside every closed-loop run two more clients send a heartbeat every --heartbeat-ms, one over
// the memory channel's kept connection (the client's default, answered by the daemon's heartbeat
// lane) and one over gRPC, and report their latency against heartbeats of the same path to the
// same daemon at rest, measured in the same run: what a lease renewal waits for while the
// workers flood the daemon.
//
// Every row also reports the host over its measured window: how busy its CPUs were, how much of
// that the hypervisor took (steal), and how late a thread that sleeps 1 ms at a time woke up
// (p99): no request can be answered sooner than its threads are woken, so that lateness is the
// floor under every latency in the row.
//
//   kvtier-bench-daemon --workers 1,8,32 --pages 2048 --seconds 3

#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"

namespace kvtier {
namespace {

struct Sample {
  std::vector<double> latencies_us;
  uint64_t plans = 0;
  uint64_t degraded = 0;          // plans the pools were short for
  std::vector<double> warmup_us;  // before the measured window (not counted above)

  // One answered request sent at `sent`: a warm-up latency before `measure_from`, else a
  // measured one. True when measured.
  bool Add(absl::Time sent, absl::Time measure_from, double us) {
    if (sent < measure_from) {
      warmup_us.push_back(us);
      return false;
    }
    latencies_us.push_back(us);
    ++plans;
    return true;
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(q * (v.size() - 1));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

std::unique_ptr<WorkerClient> Connect(const std::string& address, int index,
                                      bool heartbeat_over_channel = true,
                                      bool snapshots_over_channel = true) {
  ClientOptions o;
  o.address = address;
  o.heartbeat_over_channel = heartbeat_over_channel;
  o.snapshots_over_channel = snapshots_over_channel;
  o.rpc_deadline = absl::Seconds(5);
  auto& r = o.registration;
  r.set_worker_name(absl::StrCat("bench-", index));
  auto* g = r.mutable_geometry();
  g->set_model_name("bench");
  g->set_num_layers(2);
  g->set_num_kv_heads(1);
  g->set_head_dim(16);
  g->set_element_bytes(2);
  g->set_page_tokens(16);
  g->set_layer_groups(1);
  r.set_t1_page_bytes(2048);
  r.set_t2_page_bytes(1024);
  auto c = WorkerClient::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(c);
}

// One worker's sequences: snapshot, ack, repeat, until `stop`; waits `period` between offers.
// `stable`: each page has a fixed importance (heavy-tailed) and every step adds it with ±20%
// noise, as cumulative attention behaves in decoding; rankings drift slowly, so plans are small.
// Otherwise every page gains a fresh uniform amount each step: worst-case churn.
enum class Request { kGetStatus, kAckPlan, kCarriedAck };

const char* RequestName(Request r) {
  switch (r) {
    case Request::kGetStatus:
      return "GetStatus (baseline)";
    case Request::kAckPlan:
      return "snapshot + AckPlan";
    case Request::kCarriedAck:
      return "snapshot, ack carried";
  }
  return "";
}

// Latencies of requests sent before `measure_from` go to out->warmup_us only.
void RunWorker(WorkerClient* client, int sequences, uint32_t pages, absl::Duration period,
               absl::Time measure_from, absl::Time stop, Sample* out, int seed, bool stable,
               Request request) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  // Per-step noise from xorshift, not mt19937: the clients share the daemon's two cores, so
  // their own work is kept small (a real worker's scores come from its attention kernels).
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  const auto fast = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<float>(x >> 40) * 0x1p-24f;
  };
  std::vector<float> importance(pages);
  for (float& w : importance) w = std::pow(u(rng), 4.f);
  struct Seq {
    uint64_t id, acked = 0, carried = 0;  // carried: applied, to be acked by the next snapshot
    std::string tiers;
    std::vector<float> scores;
  };
  std::vector<Seq> seqs;
  v1::PolicyConfig policy;
  policy.set_name("hierarchy");
  policy.set_hbm_ratio(0.5);
  policy.set_evict_ratio(0.03);
  policy.set_compress_ratio(0.2);
  for (int s = 0; s < sequences; ++s) {
    auto id = client->OpenSequence(256, policy, "bench");
    seqs.push_back({*id, 0, 0, std::string(pages, '\0'), std::vector<float>(pages, 0.f)});
  }
  // Workers decode independently, so each starts at its own random phase of the period (all
  // offering at the same instant would measure a burst of W requests, not a rate).
  absl::Time next = absl::Now() + period * u(rng);
  absl::SleepFor(next - absl::Now());
  const auto pace = [&] {
    if (period == absl::ZeroDuration()) return;
    next += period;
    absl::SleepFor(next - absl::Now());
  };
  for (size_t i = 0; absl::Now() < stop; ++i) {
    if (request == Request::kGetStatus) {
      absl::Time t0 = absl::Now();
      if (client->GetStatus(false, false).ok()) {
        out->Add(t0, measure_from, absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
      pace();
      continue;
    }
    Seq& s = seqs[i % seqs.size()];
    v1::SubmitSnapshotRequest snap;
    snap.set_sequence_id(s.id);
    snap.set_length(uint64_t{pages} * 16);
    snap.set_num_pages(pages);
    snap.set_last_plan_version(s.acked);
    snap.set_applied_plan_version(std::exchange(s.carried, 0));
    snap.set_current_tiers(s.tiers);
    for (uint32_t p = 0; p < pages; ++p) {
      if (s.tiers[p] != 3) s.scores[p] += stable ? importance[p] * (0.8f + 0.4f * fast()) : fast();
    }
    snap.mutable_page_scores()->Add(s.scores.begin(), s.scores.end());
    absl::Time t0 = absl::Now();
    auto plan = client->SubmitSnapshot(std::move(snap));
    const double latency_us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!plan.ok()) continue;
    if (request == Request::kCarriedAck) {
      s.carried = plan->plan_version();
    } else if (!client->AckPlan(s.id, plan->plan_version(), true).ok()) {
      continue;
    }
    if (out->Add(t0, measure_from, latency_us)) out->degraded += plan->degraded();
    s.tiers = plan->target_tiers();
    s.acked = plan->plan_version();
    pace();
  }
  for (auto& s : seqs) (void)client->CloseSequence(s.id);
}

// CPU seconds the process has used (user + system).
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
  std::vector<std::string> f = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
  if (f.size() < 13) return 0;
  return (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);
}

// The daemon's SubmitSnapshot histogram (time inside the core, from its /metrics): cumulative
// counts per upper bound in seconds.
std::vector<std::pair<double, double>> PlanLatencyBuckets(int port) {
  std::vector<std::pair<double, double>> out;
  if (port == 0) return out;
  auto r = testing::HttpGet(port, "/metrics", absl::Seconds(2));
  if (!r.ok()) return out;
  constexpr absl::string_view kPrefix = "kvtier_plan_latency_seconds_bucket{le=\"";
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::StartsWith(line, kPrefix)) continue;
    line.remove_prefix(kPrefix.size());
    const size_t quote = line.find('"');
    double le = 0, count = 0;
    const std::string bound(line.substr(0, quote));
    le = bound == "+Inf" ? 1e9 : std::stod(bound);
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &count)) out.push_back({le, count});
  }
  return out;
}

// The smallest bucket bound under which a share `q` of the snapshots between two scrapes fell.
double InDaemonQuantileUs(const std::vector<std::pair<double, double>>& before,
                          const std::vector<std::pair<double, double>>& after, double q) {
  if (after.empty() || before.size() != after.size()) return 0;
  const double total = after.back().second - before.back().second;
  if (total <= 0) return 0;
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i].second - before[i].second >= q * total) return after[i].first * 1e6;
  }
  return 0;
}

uint64_t RssKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// The host over a window: CPU time from /proc/stat and a sleeper's wake-up lateness.
struct HostWatch {
  double busy_pct = 0;   // CPU time not idle (iowait counts as idle), steal included
  double steal_pct = 0;  // CPU time the hypervisor gave to others while this host wanted it
  double late_p99_us = 0;
};

// The "cpu" line of /proc/stat: user nice system idle iowait irq softirq steal, in ticks.
std::vector<double> CpuTicks() {
  std::ifstream in("/proc/stat");
  std::string line;
  std::getline(in, line);
  std::vector<double> ticks;
  for (absl::string_view f : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    double v = 0;
    if (absl::SimpleAtod(f, &v)) ticks.push_back(v);
  }
  ticks.resize(8, 0);
  return ticks;
}

// Sleeps 1 ms at a time from `from` to `stop`, measuring how late each wake-up is.
HostWatch WatchHost(absl::Time from, absl::Time stop) {
  absl::SleepFor(from - absl::Now());
  const std::vector<double> t0 = CpuTicks();
  std::vector<double> late_us;
  auto next = std::chrono::steady_clock::now();
  while (absl::Now() < stop) {
    next += std::chrono::milliseconds(1);
    std::this_thread::sleep_until(next);
    const auto woke = std::chrono::steady_clock::now();
    late_us.push_back(std::chrono::duration<double, std::micro>(woke - next).count());
    if (woke - next > std::chrono::milliseconds(1)) next = woke;  // no catch-up burst
  }
  const std::vector<double> t1 = CpuTicks();
  double total = 0;
  for (size_t i = 0; i < 8; ++i) total += t1[i] - t0[i];
  const double idle = (t1[3] - t0[3]) + (t1[4] - t0[4]);
  HostWatch out;
  if (total > 0) {
    out.busy_pct = 100.0 * (total - idle) / total;
    out.steal_pct = 100.0 * (t1[7] - t0[7]) / total;
  }
  out.late_p99_us = Percentile(late_us, 0.99);
  return out;
}

// Heartbeats every `period` until `stop`: their latencies.
Sample Heartbeats(WorkerClient* client, absl::Duration period, absl::Time stop) {
  Sample out;
  absl::Time next = absl::Now();
  while (absl::Now() < stop) {
    absl::Time t0 = absl::Now();
    if (client->HeartbeatOnce().ok()) {
      out.latencies_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      ++out.plans;
    }
    next += period;
    absl::SleepFor(next - absl::Now());
  }
  return out;
}

// Heartbeat probers: one per path (channel, gRPC), each client's samples.
struct Probers {
  std::vector<WorkerClient*> clients;
  absl::Duration beat = absl::Milliseconds(5);
  std::vector<Sample>* beats = nullptr;  // one per client
  int priority = 0;                      // SCHED_FIFO priority of the probing threads; 0 = none
};

// Workers as processes of their own, as on a real host (each with its own gRPC poller and
// threads): this program again in its --worker-of mode; samples come back in their output files.
struct WorkerProcesses {
  std::string self, address, dir;
  int count = 0;
  std::vector<std::string> load_flags;  // --pages, --sequences, --scores
};

// A finished worker process's output: "plans degraded", then a latency (us) a line, "w "
// before those of the warm-up.
Sample ReadSample(const std::string& path) {
  Sample out;
  std::ifstream in(path);
  in >> out.plans >> out.degraded;
  for (std::string word; in >> word;) {
    if (word == "w" && in >> word) {
      out.warmup_us.push_back(std::stod(word));
    } else {
      out.latencies_us.push_back(std::stod(word));
    }
  }
  return out;
}

// The workers load the daemon for `warmup` + `length`: `clients` as threads of this process, or,
// when `processes` is set, its processes. `probers` (may be empty) send heartbeats every `beat`
// over `length`.
// `grpc_snapshots`: the processes send their snapshots over gRPC, not the memory channel.
Sample Run(const std::vector<std::unique_ptr<WorkerClient>>& clients,
           const WorkerProcesses* processes, int sequences, uint32_t pages, absl::Duration period,
           absl::Duration warmup, absl::Duration length, bool stable, Request request,
           bool grpc_snapshots, HostWatch* host, const Probers& probers = {}) {
  const int n = processes != nullptr ? processes->count : static_cast<int>(clients.size());
  std::vector<Sample> samples(n);
  std::vector<std::thread> threads;
  // Processes register first: the load starts once they all can have.
  const absl::Time start =
      absl::Now() + (processes != nullptr ? absl::Seconds(2) : absl::ZeroDuration());
  const absl::Time measure_from = start + warmup;
  const absl::Time stop = measure_from + length;
  threads.emplace_back([host, measure_from, stop] { *host = WatchHost(measure_from, stop); });
  for (size_t i = 0; i < probers.clients.size(); ++i) {
    threads.emplace_back([&probers, i, measure_from, stop] {
      if (probers.priority > 0) {
        sched_param param{};
        param.sched_priority = probers.priority;
        if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &param) != 0) {
          std::fprintf(stderr, "--prober-priority: SCHED_FIFO refused\n");
        }
      }
      absl::SleepFor(measure_from - absl::Now());
      (*probers.beats)[i] = Heartbeats(probers.clients[i], probers.beat, stop);
    });
  }
  std::vector<pid_t> children;
  for (int w = 0; w < n; ++w) {
    if (processes == nullptr) {
      threads.emplace_back(RunWorker, clients[w].get(), sequences, pages, period, measure_from,
                           stop, &samples[w], w, stable, request);
      continue;
    }
    std::vector<std::string> argv = {processes->self,
                                     "--worker-of",
                                     processes->address,
                                     "--worker-index",
                                     absl::StrCat(w),
                                     "--worker-request",
                                     absl::StrCat(static_cast<int>(request)),
                                     "--worker-start-us",
                                     absl::StrCat(absl::ToUnixMicros(start)),
                                     "--warmup-seconds",
                                     absl::StrCat(absl::ToDoubleSeconds(warmup)),
                                     "--seconds",
                                     absl::StrCat(absl::ToDoubleSeconds(length)),
                                     "--period-ms",
                                     absl::StrCat(absl::ToDoubleMilliseconds(period))};
    argv.insert(argv.end(), processes->load_flags.begin(), processes->load_flags.end());
    if (grpc_snapshots) argv.push_back("--worker-grpc-snapshots");
    children.push_back(
        testing::SpawnProgram(argv, absl::StrCat(processes->dir, "/worker-", w, ".out")));
  }
  for (int w = 0; w < static_cast<int>(children.size()); ++w) {
    int status = 0;
    waitpid(children[w], &status, 0);
    samples[w] = ReadSample(absl::StrCat(processes->dir, "/worker-", w, ".out"));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "worker process %d failed (status %d)\n", w, status);
    }
  }
  for (auto& t : threads) t.join();
  Sample all;
  for (auto& s : samples) {
    all.plans += s.plans;
    all.degraded += s.degraded;
    all.latencies_us.insert(all.latencies_us.end(), s.latencies_us.begin(), s.latencies_us.end());
    all.warmup_us.insert(all.warmup_us.end(), s.warmup_us.begin(), s.warmup_us.end());
  }
  return all;
}

// --worker-of: one worker process of a --processes run; prints its sample on stdout.
int WorkerProcessMain(const std::string& address, int index, Request request, absl::Time start,
                      absl::Duration warmup, absl::Duration length, absl::Duration period,
                      int sequences, uint32_t pages, bool stable, bool grpc_snapshots) {
  std::unique_ptr<WorkerClient> client = Connect(address, index, true, !grpc_snapshots);
  absl::SleepFor(start - absl::Now());
  Sample s;
  RunWorker(client.get(), sequences, pages, period, start + warmup, start + warmup + length, &s,
            index, stable, request);
  std::printf("%lu %lu\n", static_cast<unsigned long>(s.plans),
              static_cast<unsigned long>(s.degraded));
  for (double us : s.warmup_us) std::printf("w %.1f\n", us);
  for (double us : s.latencies_us) std::printf("%.1f\n", us);
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  using namespace kvtier;
  CLI::App app{"kvtier daemon benchmark: snapshot->plan round trips over the unix socket"};
  std::string workers_list = "1,8,32";
  uint32_t pages = 2048;
  double seconds = 3;
  double period_ms = 10;
  int sequences = 8;
  std::string scores = "stable";
  app.add_option("--workers", workers_list, "Comma-separated worker counts")->capture_default_str();
  app.add_option("--pages", pages, "Pages per snapshot")->capture_default_str();
  app.add_option("--sequences", sequences, "Sequences per worker")->capture_default_str();
  app.add_option("--seconds", seconds, "Seconds per measurement")->capture_default_str();
  app.add_option("--period-ms", period_ms, "Open-loop period per worker")->capture_default_str();
  double heartbeat_ms = 5;
  app.add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat probe period beside closed loops")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string loads = "open,closed";
  app.add_option("--loads", loads, "open, closed or both")
      ->check(CLI::IsMember({"open", "closed", "open,closed"}))
      ->capture_default_str();
  app.add_option("--scores", scores, "stable (decoding-like) | random (worst-case churn)")
      ->check(CLI::IsMember({"stable", "random"}))
      ->capture_default_str();
  uint32_t ddr_mib = 1024, compressed_mib = 512;  // kvtierd's defaults
  app.add_option("--ddr-mib", ddr_mib, "DDR pool size (small: measures degraded plans)")
      ->capture_default_str();
  app.add_option("--compressed-mib", compressed_mib, "Compressed pool size")->capture_default_str();
  int policy_threads = -1;
  app.add_option(
         "--policy-threads", policy_threads,
         "kvtierd's server.policy_threads (-1: its default; 0: snapshots on gRPC's threads)")
      ->check(CLI::Range(-1, 64));
  int heartbeat_priority = -1;
  app.add_option("--heartbeat-priority", heartbeat_priority,
                 "kvtierd's server.heartbeat_priority (-1: its default; 0: no SCHED_FIFO)")
      ->check(CLI::Range(-1, 99));
  int prober_priority = 0;
  app.add_option("--prober-priority", prober_priority,
                 "SCHED_FIFO priority of the heartbeat probers' threads (0: the default policy), "
                 "as a worker whose heartbeat thread may run real-time")
      ->check(CLI::Range(0, 99))
      ->capture_default_str();
  double warmup_seconds = 1;
  app.add_option("--warmup-seconds", warmup_seconds,
                 "Load before each measurement, not counted (the first plans of fresh sequences "
                 "demote most of their pages at once); its p99 is the last column")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bool processes = false;
  app.add_flag("--processes", processes,
               "Each worker a process of its own, as on a real host (default: threads of this "
               "process, which share one gRPC poller)");
  std::string snapshots_over = "channel,grpc";
  app.add_option("--snapshots-over", snapshots_over,
                 "How workers send snapshots: the memory channel, gRPC, or both (rows of each)")
      ->check(CLI::IsMember({"channel", "grpc", "channel,grpc"}))
      ->capture_default_str();
  std::string worker_of;
  bool worker_grpc_snapshots = false;
  app.add_flag("--worker-grpc-snapshots", worker_grpc_snapshots)->group("");
  int worker_index = 0, worker_request = 0;
  int64_t worker_start_us = 0;
  app.add_option("--worker-of", worker_of)->group("");  // a --processes run's worker
  app.add_option("--worker-index", worker_index)->group("");
  app.add_option("--worker-request", worker_request)->group("");
  app.add_option("--worker-start-us", worker_start_us)->group("");
  CLI11_PARSE(app, argc, argv);
  // As in kvtierd: Debian's Abseil checks every Mutex acquisition (gRPC's included) for lock-order
  // cycles under one global lock; the clients share the daemon's cores, so they skip it too.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!worker_of.empty()) {
    return WorkerProcessMain(worker_of, worker_index, static_cast<Request>(worker_request),
                             absl::FromUnixMicros(worker_start_us), absl::Seconds(warmup_seconds),
                             absl::Seconds(seconds), absl::Microseconds(period_ms * 1000),
                             sequences, pages, scores == "stable", worker_grpc_snapshots);
  }
  const int metrics_port = *testing::FreeLoopbackPort();
  const std::string metrics = absl::StrCat("127.0.0.1:", metrics_port);

  auto daemon = testing::DaemonProcess::Start(
      {.config_text = absl::StrCat(
           "[server]\n",
           policy_threads >= 0 ? absl::StrCat("policy_threads = ", policy_threads, "\n") : "",
           heartbeat_priority >= 0 ? absl::StrCat("heartbeat_priority = ", heartbeat_priority, "\n")
                                   : "",
           "[limits]\nmax_sequences_per_worker = 4096\n"),
       .metrics_address = metrics,
       .ddr_mib = ddr_mib,
       .compressed_mib = compressed_mib});
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "| workers | load | request | per s | p50 us | p99 us | p50 / baseline | p99 / baseline | "
      "degraded | daemon RSS MiB | daemon CPU us/req | in-daemon p99 us <= | host busy %% | "
      "host steal %% | wake-up late p99 us | warm-up p99 us |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const absl::Duration beat = absl::Microseconds(heartbeat_ms * 1000);
  const char* kPaths[] = {"channel", "gRPC"};
  std::vector<std::unique_ptr<WorkerClient>> probers;
  probers.push_back(Connect((*daemon)->address(), -1, /*heartbeat_over_channel=*/true));
  probers.push_back(Connect((*daemon)->address(), -2, /*heartbeat_over_channel=*/false));
  // Heartbeats of each path to the daemon at rest: the baselines of the heartbeat rows.
  std::vector<double> rest_p50, rest_p99;
  for (size_t i = 0; i < probers.size(); ++i) {
    const absl::Time stop = absl::Now() + absl::Seconds(seconds);
    HostWatch host;
    std::thread watch([&host, stop] { host = WatchHost(absl::Now(), stop); });
    Sample rest = Heartbeats(probers[i].get(), beat, stop);
    watch.join();
    rest_p50.push_back(Percentile(rest.latencies_us, 0.5));
    rest_p99.push_back(Percentile(rest.latencies_us, 0.99));
    std::printf(
        "| 0 | idle | heartbeat (%s; baseline of its rows) | %.0f | %.0f | %.0f | 1.0x | 1.0x "
        "| - | %.1f | - | - | %.0f | %.1f | %.0f | - |\n",
        kPaths[i], rest.plans / seconds, rest_p50[i], rest_p99[i],
        RssKiB((*daemon)->pid()) / 1024.0, host.busy_pct, host.steal_pct, host.late_p99_us);
  }
  for (absl::string_view w : absl::StrSplit(workers_list, ',')) {
    int n = std::stoi(std::string(w));
    const bool over[2] = {absl::StrContains(snapshots_over, "channel"),
                          absl::StrContains(snapshots_over, "grpc")};
    WorkerProcesses spawn{"/proc/self/exe",
                          (*daemon)->address(),
                          (*daemon)->dir(),
                          n,
                          {"--pages", absl::StrCat(pages), "--sequences", absl::StrCat(sequences),
                           "--scores", scores}};
    // Per snapshot path (channel, gRPC) asked for, the workers of its rows: a baseline of their
    // own, then both requests. They close before the other path's connect (their extents would
    // crowd the pools).
    for (int path = 0; path < 2; ++path) {
      if (!over[path]) continue;
      std::vector<std::unique_ptr<WorkerClient>> clients;
      for (int i = 0; i < n && !processes; ++i) {
        clients.push_back(Connect((*daemon)->address(), i, true, path == 0));
      }
      for (bool open_loop : {true, false}) {
        if (!absl::StrContains(loads, open_loop ? "open" : "closed")) continue;
        double base_p50 = 0, base_p99 = 0;
        for (Request request : {Request::kGetStatus, Request::kAckPlan, Request::kCarriedAck}) {
          auto period = open_loop ? absl::Microseconds(period_ms * 1000) : absl::ZeroDuration();
          std::vector<Sample> beats(probers.size());
          Probers probing{{}, beat, &beats, prober_priority};
          if (!open_loop) {
            for (auto& p : probers) probing.clients.push_back(p.get());
          }
          HostWatch host;
          const double cpu0 = CpuSeconds((*daemon)->pid());
          const auto buckets0 = PlanLatencyBuckets(metrics_port);
          Sample s = Run(clients, processes ? &spawn : nullptr, sequences, pages, period,
                         absl::Seconds(warmup_seconds), absl::Seconds(seconds), scores == "stable",
                         request, path == 1, &host, probing);
          uint64_t beat_count = 0;
          for (const Sample& b : beats) beat_count += b.plans;
          const double cpu_us = 1e6 * (CpuSeconds((*daemon)->pid()) - cpu0) /
                                std::max<uint64_t>(1, s.plans + s.warmup_us.size() + beat_count);
          const double core_p99 =
              InDaemonQuantileUs(buckets0, PlanLatencyBuckets(metrics_port), 0.99);
          const double p50 = Percentile(s.latencies_us, 0.5),
                       p99 = Percentile(s.latencies_us, 0.99);
          if (request == Request::kGetStatus) base_p50 = p50, base_p99 = p99;
          const std::string load =
              open_loop ? absl::StrCat("open, ", period_ms, " ms each") : "closed";
          const std::string name =
              request == Request::kGetStatus
                  ? RequestName(request)
                  : absl::StrCat(RequestName(request), " (", kPaths[path], ")");
          std::printf(
              "| %d | %s | %s | %.0f | %.0f | %.0f | %.1fx | %.1fx | %.0f%% | %.1f | %.0f | %s | "
              "%.0f | %.1f | %.0f | %.0f |\n",
              n, load.c_str(), name.c_str(), s.plans / seconds, p50, p99, p50 / base_p50,
              p99 / base_p99, 100.0 * s.degraded / std::max<uint64_t>(1, s.plans),
              RssKiB((*daemon)->pid()) / 1024.0, cpu_us,
              request == Request::kGetStatus ? "-" : absl::StrCat(core_p99).c_str(), host.busy_pct,
              host.steal_pct, host.late_p99_us, Percentile(s.warmup_us, 0.99));
          for (size_t i = 0; !open_loop && i < probers.size(); ++i) {
            const double b50 = Percentile(beats[i].latencies_us, 0.5);
            const double b99 = Percentile(beats[i].latencies_us, 0.99);
            std::printf(
                "| %d | %s | heartbeat (%s) beside %s | %.0f | %.0f | %.0f | %.1fx | %.1fx | - | "
                "- | - | - | - | - | - | - |\n",
                n, load.c_str(), kPaths[i], name.c_str(), beats[i].plans / seconds, b50, b99,
                b50 / rest_p50[i], b99 / rest_p99[i]);
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
