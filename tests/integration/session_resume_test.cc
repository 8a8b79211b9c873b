// Sessions that survive a hiccup, with real processes and real signals: workers decoding through
// kvtierd while the daemon is stopped (SIGSTOP) past the RPC deadline keep their worker ids and
// go on tiering, token for token identical to the full cache; a worker stopped past its lease
// loses nothing it stored and stays identical too.
//
// The workers are forked before this process touches gRPC; each reports one line on a pipe.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/support/lossless_runtime.h"
#include "tests/support/synthetic_engine.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker {
namespace {

using kvtier::testing::DaemonProcess;
using kvtier::testing::SyntheticEngine;

constexpr int kSteps = 1000;
constexpr absl::Duration kPace = absl::Milliseconds(3);  // ~3 s of decoding

AttentionShape Shape() { return kvtier::testing::SmallShape(); }
using kvtier::testing::Lossless;

// What one worker process saw.
struct Outcome {
  bool identical = false;  // every step's output equal to the full cache, bit for bit
  uint64_t id_before = 0, id_after = 0;
  uint64_t generation_before = 0, generation_after = 0;
  double mean_t1_tokens = 0;  // DDR tokens held, averaged over the steps
  uint64_t plans = 0, degraded = 0;
  uint64_t rejoins = 0;                     // re-opened under a new session
  bool backed = false;                      // tiering with the daemon at the end
  uint64_t t1_tokens_end = 0;               // DDR tokens held at the end
  double step_p99_ms = 0, step_max_ms = 0;  // the tiered sequence's decode steps
  std::string error;
};

std::string Encode(const Outcome& o) {
  return absl::StrCat(o.identical, " ", o.id_before, " ", o.id_after, " ", o.generation_before, " ",
                      o.generation_after, " ", o.mean_t1_tokens, " ", o.plans, " ", o.degraded, " ",
                      o.rejoins, " ", o.backed, " ", o.t1_tokens_end, " ", o.step_p99_ms, " ",
                      o.step_max_ms, " ", o.error.empty() ? "-" : o.error);
}

Outcome Decode(const std::vector<std::string>& f) {
  Outcome o;
  if (f.size() < 14) {
    o.error = "short report";
    return o;
  }
  o.identical = f[0] == "1";
  o.id_before = std::stoull(f[1]);
  o.id_after = std::stoull(f[2]);
  o.generation_before = std::stoull(f[3]);
  o.generation_after = std::stoull(f[4]);
  o.mean_t1_tokens = std::stod(f[5]);
  o.plans = std::stoull(f[6]);
  o.degraded = std::stoull(f[7]);
  o.rejoins = std::stoull(f[8]);
  o.backed = f[9] == "1";
  o.t1_tokens_end = std::stoull(f[10]);
  o.step_p99_ms = std::stod(f[11]);
  o.step_max_ms = std::stod(f[12]);
  for (size_t i = 13; i < f.size(); ++i) o.error += (i > 13 ? " " : "") + f[i];
  if (o.error == "-") o.error.clear();
  return o;
}

// The worker: a full-cache sequence (local) and a tiered one (through the daemon), fed the same
// synthetic model; compares every step. `ready` runs once both are open (the session registered).
Outcome RunWorker(const std::string& address, uint64_t seed, const std::function<void()>& ready) {
  Outcome out;
  auto local =
      WorkerRuntime::Create({.attention = Shape(), .page_tokens = 4, .arena_bytes = 1 << 28});
  auto remote = WorkerRuntime::Create(
      {.attention = Shape(), .page_tokens = 4, .daemon_address = address, .arena_bytes = 1 << 28});
  if (!local.ok() || !remote.ok()) {
    out.error = std::string((!local.ok() ? local.status() : remote.status()).message());
    return out;
  }
  auto full = (*local)->Open(Lossless(1));
  auto tiered = (*remote)->Open(Lossless(0.3));
  if (!full.ok() || !tiered.ok()) {
    out.error = "open failed";
    return out;
  }
  out.id_before = (*remote)->client()->worker_id();
  out.generation_before = (*remote)->client()->generation();
  ready();
  SyntheticEngine engine(Shape(), seed);
  std::vector<float> a, b;
  out.identical =
      engine.Forward(**full, 24, &a).ok() && engine.Forward(**tiered, 24, &b).ok() && a == b;
  double t1_sum = 0;
  std::vector<double> step_ms;
  for (int step = 0; step < kSteps && out.identical; ++step) {
    absl::Status sa = engine.Forward(**full, 1, &a);
    const absl::Time t0 = absl::Now();
    absl::Status sb = engine.Forward(**tiered, 1, &b);
    step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!sa.ok() || !sb.ok()) {
      out.error = std::string((!sa.ok() ? sa : sb).message());
      out.identical = false;
      break;
    }
    out.identical = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    t1_sum += static_cast<double>((*tiered)->Report().tokens[1]);
    absl::SleepFor(kPace);
  }
  out.mean_t1_tokens = t1_sum / kSteps;
  std::sort(step_ms.begin(), step_ms.end());
  if (!step_ms.empty()) {
    out.step_p99_ms = step_ms[step_ms.size() * 99 / 100];
    out.step_max_ms = step_ms.back();
  }
  out.id_after = (*remote)->client()->worker_id();
  out.generation_after = (*remote)->client()->generation();
  out.plans = (*tiered)->Report().plans;
  out.degraded = (*tiered)->Report().degraded_plans;
  out.rejoins = (*tiered)->rejoins();
  out.backed = (*tiered)->daemon_backed();
  out.t1_tokens_end = (*tiered)->Report().tokens[1];
  return out;
}

struct Worker {
  pid_t pid = -1;
  int report = -1;
  int ready = -1;  // one byte once registered; end of file if it never got that far
};

Worker Fork(const std::string& address, uint64_t seed) {
  int fds[2], ready[2];
  if (pipe(fds) != 0) return {};
  if (pipe(ready) != 0) {
    close(fds[0]);
    close(fds[1]);
    return {};
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    close(ready[0]);
    const Outcome o = RunWorker(address, seed, [&] {
      (void)!write(ready[1], "r", 1);
      close(ready[1]);
    });
    const std::string line = Encode(o) + "\n";
    (void)!write(fds[1], line.data(), line.size());
    _exit(0);
  }
  close(fds[1]);
  close(ready[1]);
  return {pid, fds[0], ready[0]};
}

// Blocks until the worker registered (or died trying).
void AwaitReady(Worker& w) {
  char byte;
  while (read(w.ready, &byte, 1) < 0 && errno == EINTR) {
  }
  close(w.ready);
  w.ready = -1;
}

Outcome Join(const Worker& w) {
  std::string line;
  char buf[512];
  ssize_t n;
  while ((n = read(w.report, buf, sizeof(buf))) > 0) line.append(buf, n);
  close(w.report);
  int status = 0;
  waitpid(w.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Outcome o;
    o.error = absl::StrCat("worker died (status ", status, ")");
    return o;
  }
  if (!line.empty() && line.back() == '\n') line.pop_back();
  return Decode(absl::StrSplit(line, ' '));
}

// Three workers; `meanwhile` runs once all have registered, so a stall it makes finds sessions to
// keep however slowly the workers started (ThreadSanitizer, a loaded host).
std::vector<Outcome> RunThree(const std::string& address, const std::function<void()>& meanwhile) {
  std::vector<Worker> workers;
  for (uint64_t seed : {11, 12, 13}) workers.push_back(Fork(address, seed));
  for (Worker& w : workers) AwaitReady(w);
  meanwhile();
  std::vector<Outcome> outcomes;
  for (const Worker& w : workers) outcomes.push_back(Join(w));
  return outcomes;
}

TEST(SessionResumeTest, ThreeWorkersKeepTheirSessionsAcrossThreeDaemonStalls) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::vector<Outcome> calm = RunThree((*daemon)->address(), [] {});
  const pid_t pid = (*daemon)->pid();
  const std::vector<Outcome> stalled = RunThree((*daemon)->address(), [pid] {
    absl::SleepFor(absl::Milliseconds(400));
    for (int i = 0; i < 3; ++i) {
      kill(pid, SIGSTOP);  // 0.6 s: three times the 200 ms RPC deadline
      absl::SleepFor(absl::Milliseconds(600));
      kill(pid, SIGCONT);
      absl::SleepFor(absl::Milliseconds(500));
    }
  });
  for (int i = 0; i < 3; ++i) {
    const Outcome& c = calm[i];
    const Outcome& s = stalled[i];
    SCOPED_TRACE(absl::StrCat("worker ", i, ": calm ", Encode(c), " / stalled ", Encode(s)));
    ASSERT_TRUE(c.error.empty() && s.error.empty());
    EXPECT_TRUE(c.identical);
    EXPECT_TRUE(s.identical) << "a stall changed a token";
    EXPECT_EQ(s.id_after, s.id_before) << "the worker registered again instead of resuming";
    EXPECT_EQ(s.generation_after, s.generation_before);
    EXPECT_EQ(s.rejoins, 0u);
    EXPECT_TRUE(s.backed);
    EXPECT_GT(c.mean_t1_tokens, 100);
    // Tiering went on after the stalls: DDR holds nearly what it holds without them.
    EXPECT_GE(s.mean_t1_tokens, 0.8 * c.mean_t1_tokens);
    // And it is back to where it would be: the last plans placed as many tokens in DDR.
    EXPECT_GE(s.t1_tokens_end, 0.9 * c.t1_tokens_end);
    std::printf(
        "worker %d: DDR tokens (mean over steps) %.0f calm, %.0f with stalls (%.2fx); "
        "plans %lu / %lu, degraded with stalls %lu; decode step p99 %.3f / %.3f ms, max %.2f / "
        "%.2f ms (calm / stalls)\n",
        i, c.mean_t1_tokens, s.mean_t1_tokens, s.mean_t1_tokens / c.mean_t1_tokens,
        static_cast<unsigned long>(c.plans), static_cast<unsigned long>(s.plans),
        static_cast<unsigned long>(s.degraded), c.step_p99_ms, s.step_p99_ms, c.step_max_ms,
        s.step_max_ms);
  }
}

TEST(SessionResumeTest, AWorkerStoppedPastItsLeaseLosesNothingAndStaysIdentical) {
  auto daemon = DaemonProcess::Start(
      {.config_text =
           "[server]\nreap_interval_ms = 100\n[leases]\nttl_ms = 1000\nheartbeat_ms = 200\n"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Worker sleeper = Fork((*daemon)->address(), 21);
  Worker busy = Fork((*daemon)->address(), 22);  // offloads all along, into fresh extents
  AwaitReady(sleeper);
  AwaitReady(busy);
  absl::SleepFor(absl::Milliseconds(800));
  kill(sleeper.pid, SIGSTOP);
  EXPECT_TRUE((*daemon)->WaitForLog("lease expired: reaped 1 worker", absl::Seconds(5)))
      << (*daemon)->Log();
  absl::SleepFor(absl::Milliseconds(300));
  kill(sleeper.pid, SIGCONT);
  const Outcome s = Join(sleeper), b = Join(busy);
  SCOPED_TRACE(absl::StrCat("sleeper ", Encode(s), " / busy ", Encode(b)));
  ASSERT_TRUE(b.error.empty());
  EXPECT_TRUE(b.identical);
  // Identical, or a clear error: never a silent divergence. Here: identical, on its own pages.
  EXPECT_TRUE(s.identical || !s.error.empty());
  EXPECT_TRUE(s.identical) << s.error;
  EXPECT_GT(s.generation_after, s.generation_before) << "the lease was lost: a new session";
  EXPECT_EQ(b.generation_after, b.generation_before);
  // Its sequence re-opened under the new session and tiers again, in fresh memory.
  EXPECT_EQ(s.rejoins, 1u);
  EXPECT_TRUE(s.backed);
  EXPECT_GT(s.t1_tokens_end, 0u);
}

}  // namespace
}  // namespace kvtier::worker
