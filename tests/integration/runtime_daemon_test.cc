// The worker runtime against a real kvtierd: daemon-planned tiering stays bit-exact, and a
// daemon that dies mid-sequence costs nothing already stored.

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

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

AttentionShape Shape() { return kvtier::testing::SmallShape(); }
using kvtier::testing::Lossless;

// A decode step of a real model takes milliseconds; the synthetic one microseconds. Plans come
// back in the background (DaemonLane), so the tests pace their steps like a model would.
constexpr absl::Duration kStep = absl::Milliseconds(1);

std::unique_ptr<WorkerRuntime> Runtime(const std::string& daemon, v1::HostLink link = {}) {
  auto r = WorkerRuntime::Create({.attention = Shape(),
                                  .page_tokens = 4,
                                  .daemon_address = daemon,
                                  .arena_bytes = 1 << 28,
                                  .link = link});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// A socket path of its own that a restarted daemon can take over.
std::string RestartableSocket(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir + "/kvtierd.sock";
}

// FNV-1a of one page's full-precision values (dequantized for T2): what attention reads.
uint64_t PageChecksum(const TieredKvStore& store, uint32_t group, uint32_t page) {
  std::vector<float> values(store.geometry().PageBytes(group) / sizeof(float));
  if (!store.ReadPage(group, page, values.data()).ok()) return 0;
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// The checksum of every page now in T1 or T2 (those the daemon's pools hold), by (group, page).
std::map<std::pair<uint32_t, uint32_t>, uint64_t> PooledChecksums(const TieredKvStore& store) {
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> sums;
  const tiering::Placement placement = store.placement();
  for (uint32_t g = 0; g < placement.num_groups; ++g) {
    for (uint32_t p = 0; p < placement.num_pages; ++p) {
      const tiering::Tier t = placement.at(g, p);
      if (t == tiering::Tier::kT1 || t == tiering::Tier::kT2) {
        sums[{g, p}] = PageChecksum(store, g, p);
      }
    }
  }
  return sums;
}

// Pages of `before` whose checksum changed; pages back in T2 are skipped (a page compressed
// again after it came home is re-quantized) and counted in `skipped`.
int ChangedPages(const TieredKvStore& store,
                 const std::map<std::pair<uint32_t, uint32_t>, uint64_t>& before, int* skipped) {
  int changed = 0;
  for (const auto& [at, sum] : before) {
    if (store.TierOf(at.first, at.second) == tiering::Tier::kT2) {
      ++*skipped;
      continue;
    }
    changed += PageChecksum(store, at.first, at.second) != sum;
  }
  return changed;
}

TEST(RuntimeDaemonTest, DaemonPlannedTieringIsBitIdenticalToFull) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto local = Runtime("");
  auto remote = Runtime((*daemon)->address());
  ASSERT_TRUE(local && remote);
  auto full = local->Open(Lossless(1));
  auto tiered = remote->Open(Lossless(0.3));
  ASSERT_TRUE(full.ok() && tiered.ok()) << tiered.status();
  SyntheticEngine engine(Shape(), 21);
  std::vector<float> a, b;
  ASSERT_TRUE(engine.Forward(**full, 24, &a).ok());
  ASSERT_TRUE(engine.Forward(**tiered, 24, &b).ok());
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE(engine.Forward(**full, 1, &a).ok());
    ASSERT_TRUE(engine.Forward(**tiered, 1, &b).ok());
    absl::SleepFor(kStep);
  }
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  SequenceReport r = (*tiered)->Report();
  EXPECT_TRUE((*tiered)->daemon_backed());
  EXPECT_GT(r.offload_bytes, 0u);
  EXPECT_EQ(r.local_plans, 0u);
  EXPECT_GT(r.plans, 5u);
  // The daemon sees the sequence and the HBM it saves.
  auto status = remote->client()->GetStatus(false, true);
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->sequence_list_size(), 1);
  EXPECT_GT(status->hbm_saved_bytes(), 0u);
}

// "Protect the last user turn" through kvtierd: the daemon plans with the sequence's
// protected_prompt_begin (OpenSequenceRequest), so the prompt before it leaves T0 while the
// turn stays, page for page as local planning places it (plans land at the same steps).
TEST(RuntimeDaemonTest, TheDaemonProtectsThePromptFromProtectedPromptBegin) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto local = Runtime("");
  auto remote = Runtime((*daemon)->address());
  ASSERT_TRUE(local && remote);
  SequenceOptions o = Lossless(0.3);
  o.prompt_tokens = 64;
  o.protected_prompt_begin = 48;
  o.tiering.protect_prompt = true;
  o.tiering.window_tokens = 8;
  o.wait_for_plans = true;
  auto here = local->Open(o);
  auto there = remote->Open(o);
  ASSERT_TRUE(here.ok() && there.ok()) << there.status();
  SyntheticEngine engine(Shape(), 5);
  std::vector<float> a, b;
  ASSERT_TRUE(engine.Forward(**here, 64, &a).ok());
  ASSERT_TRUE(engine.Forward(**there, 64, &b).ok());
  for (int step = 0; step < 40; ++step) {
    ASSERT_TRUE(engine.Forward(**here, 1, &a).ok());
    ASSERT_TRUE(engine.Forward(**there, 1, &b).ok());
  }
  EXPECT_TRUE((*there)->daemon_backed());
  EXPECT_GT((*there)->Report().plans, 0u);
  EXPECT_EQ((*there)->Report().local_plans, 0u);
  const tiering::Placement p = (*there)->store().placement();
  EXPECT_EQ(p.tiers, (*here)->store().placement().tiers);
  int before_begin_off_t0 = 0;
  for (uint32_t g = 0; g < p.num_groups; ++g) {
    for (uint32_t page = 0; page < 16; ++page) {  // the prompt: pages [0, 12) before the begin
      if (page >= 12) {
        EXPECT_EQ(p.at(g, page), tiering::Tier::kT0) << "group " << g << " page " << page;
      } else {
        before_begin_off_t0 += p.at(g, page) != tiering::Tier::kT0;
      }
    }
  }
  EXPECT_GT(before_begin_off_t0, 0);  // kvtierd protecting the whole prompt keeps all in T0
}

TEST(RuntimeDaemonTest, DaemonKilledMidSequenceLosesNothingAndWorkersRejoin) {
  const std::string sock = RestartableSocket("runtime-restart");
  auto daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto local = Runtime("");
  auto remote = Runtime("unix:" + sock);
  ASSERT_TRUE(local && remote);
  auto full = local->Open(Lossless(1));
  auto tiered = remote->Open(Lossless(0.3));
  ASSERT_TRUE(full.ok() && tiered.ok());
  SyntheticEngine engine(Shape(), 4);
  std::vector<float> a, b;
  ASSERT_TRUE(engine.Forward(**full, 24, &a).ok());
  ASSERT_TRUE(engine.Forward(**tiered, 24, &b).ok());
  auto step_both = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      ASSERT_TRUE(engine.Forward(**full, 1, &a).ok());
      absl::Status s = engine.Forward(**tiered, 1, &b);
      ASSERT_TRUE(s.ok()) << s;
      absl::SleepFor(kStep);
    }
  };
  step_both(100);
  ASSERT_GT((*tiered)->Report().ddr_bytes, 0u);
  ASSERT_EQ((*daemon)->Stop(SIGKILL), 128 + SIGKILL);  // pages sit in its (now orphaned) pool
  step_both(100);                                      // decoding goes on without the daemon
  daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  for (int i = 0; i < 200 && !remote->client()->connected(); ++i) {
    if (!remote->client()->HeartbeatOnce().ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(remote->client()->connected());
  step_both(100);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
      << "a page was lost or corrupted while the daemon was away";
  // The sequence re-opened under the new session (its pooled pages promoted home first) and
  // tiers with the new daemon again.
  EXPECT_TRUE((*tiered)->daemon_backed());
  EXPECT_EQ((*tiered)->rejoins(), 1u);
  EXPECT_GT((*tiered)->Report().degraded_plans, 0u);
  EXPECT_GT((*tiered)->Report().ddr_bytes, 0u);
  // New sequences use the new daemon.
  auto fresh = remote->Open(Lossless(0.3));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*fresh)->daemon_backed());
}

// A worker that declares a narrow host link gets schedules with every plan and follows them:
// the pages they leave in place are attended by split attention (exact up to one merge's
// rounding), and a stale schedule is refused without changing a thing — after it, attention is
// whole again and bit-identical to `full`.
TEST(RuntimeDaemonTest, SchedulesAreFollowedWithSplitAttentionAndAStaleOneIsRefused) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  v1::HostLink link;
  link.set_link_id("sw0");
  link.set_link_bytes_per_second(2e5);  // 4 KB a 20 ms step: most of T1 stays in place
  link.set_staging_bytes(2048);
  auto local = Runtime("");
  auto remote = Runtime((*daemon)->address(), link);
  ASSERT_TRUE(local && remote);
  auto full = local->Open(Lossless(1));
  auto tiered = remote->Open(Lossless(0.3));
  ASSERT_TRUE(full.ok() && tiered.ok()) << tiered.status();
  SyntheticEngine engine(Shape(), 8);
  std::vector<float> a, b;
  ASSERT_TRUE(engine.Forward(**full, 24, &a).ok());
  ASSERT_TRUE(engine.Forward(**tiered, 24, &b).ok());
  double worst = 0;
  for (int step = 0; step < 160; ++step) {
    ASSERT_TRUE(engine.Forward(**full, 1, &a).ok());
    ASSERT_TRUE(engine.Forward(**tiered, 1, &b).ok());
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double{std::fabs(a[i] - b[i])});
    absl::SleepFor(kStep);
  }
  SequenceReport r = (*tiered)->Report();
  ASSERT_TRUE((*tiered)->daemon_backed());
  EXPECT_GT(r.schedules, 3u);
  EXPECT_EQ(r.schedules_refused, 0u);
  EXPECT_GT(r.in_place_bytes, 0u) << "the narrow link leaves pages in place";
  EXPECT_LE(r.resident_bytes, 2048u);
  EXPECT_GT(r.split_attends, 0u);
  EXPECT_LT(worst, 1e-4) << "split attention is exact up to rounding";
  // The daemon shows the worker's share of its link and the step time it measured.
  auto status = remote->client()->GetStatus(true, false);
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->worker_list_size(), 1);
  EXPECT_EQ(status->worker_list(0).link_id(), "sw0");
  EXPECT_GT(status->worker_list(0).h2d_grant_bytes_per_second(), 0);
  EXPECT_LE(status->worker_list(0).h2d_grant_bytes_per_second(), 2e5);

  // A schedule of an older plan arrives late: refused, and attention is whole from then on.
  absl::Status stale = (*tiered)->FollowSchedule(1, v1::PrefetchSchedule());
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_NE(stale.message().find("stale"), std::string::npos) << stale;
  EXPECT_EQ((*tiered)->Report().schedules_refused, 1u);
  EXPECT_EQ((*tiered)->store().in_place_pages(), 0u);
  const uint64_t splits = (*tiered)->store().stats().split_attends;
  std::vector<float> a2, b2;
  ASSERT_TRUE(engine.Forward(**full, 1, &a2).ok());
  ASSERT_TRUE(engine.Forward(**tiered, 1, &b2).ok());
  EXPECT_EQ((*tiered)->store().stats().split_attends, splits);
  EXPECT_EQ(0, std::memcmp(a2.data(), b2.data(), a2.size() * sizeof(float)));
}

// The T1 and T2 pages a worker holds when kvtierd is killed keep their bytes, by checksum: while
// the daemon is away, when the sequence rejoins the new daemon (its pooled pages come home), and
// after it has tiered under the new daemon for a while.
TEST(RuntimeDaemonTest, PooledPagesKeepTheirChecksumsAcrossADaemonKill) {
  const std::string sock = RestartableSocket("runtime-checksum");
  auto daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto remote = Runtime("unix:" + sock);
  ASSERT_TRUE(remote);
  SequenceOptions options = Lossless(0.3);
  options.tiering.budgets.compress_ratio = 0.4;  // T2 pages too
  auto tiered = remote->Open(options);
  ASSERT_TRUE(tiered.ok()) << tiered.status();
  SyntheticEngine engine(Shape(), 9);
  std::vector<float> out;
  ASSERT_TRUE(engine.Forward(**tiered, 24, &out).ok());
  auto step = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      absl::Status s = engine.Forward(**tiered, 1, &out);
      ASSERT_TRUE(s.ok()) << s;
      absl::SleepFor(kStep);
    }
  };
  step(160);
  const TieredKvStore& store = (*tiered)->store();
  const auto held = PooledChecksums(store);
  int t1 = 0, t2 = 0;
  for (const auto& [at, _] : held) {
    (store.TierOf(at.first, at.second) == tiering::Tier::kT1 ? t1 : t2)++;
  }
  ASSERT_GT(t1, 0) << "no T1 page to check";
  ASSERT_GT(t2, 0) << "no T2 page to check";

  ASSERT_EQ((*daemon)->Stop(SIGKILL), 128 + SIGKILL);
  step(40);  // decoding goes on over the orphaned pools
  int skipped = 0;
  EXPECT_EQ(ChangedPages(store, held, &skipped), 0) << "a page changed while the daemon was away";
  daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Step by step until the sequence rejoins: its pooled pages are home, none changed.
  for (int i = 0; i < 2000 && (*tiered)->rejoins() == 0; ++i) {
    if (!remote->client()->connected()) (void)remote->client()->HeartbeatOnce();
    step(1);
  }
  ASSERT_EQ((*tiered)->rejoins(), 1u);
  skipped = 0;
  EXPECT_EQ(ChangedPages(store, held, &skipped), 0) << "a page changed when it came home";
  EXPECT_EQ(skipped, 0) << "pages of the old pools still in T2 after the rejoin";
  // Under the new daemon: tiered again (pooled anew), still the same bytes.
  step(160);
  EXPECT_GT((*tiered)->Report().ddr_bytes, 0u);
  skipped = 0;
  EXPECT_EQ(ChangedPages(store, held, &skipped), 0) << "a page changed under the new daemon";
  EXPECT_LT(skipped, static_cast<int>(held.size())) << "every page was compressed again";
  std::printf("checksums: %d T1 + %d T2 pages held at the kill, 0 changed; %d back in T2 later\n",
              t1, t2, skipped);
}

}  // namespace
}  // namespace kvtier::worker
