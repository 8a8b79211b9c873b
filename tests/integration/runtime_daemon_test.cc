// The worker runtime against a real kvtierd: daemon-planned tiering stays bit-exact, and a
// daemon that dies mid-sequence costs nothing already stored.

#include <signal.h>

#include <cstring>
#include <filesystem>

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

std::unique_ptr<WorkerRuntime> Runtime(const std::string& daemon) {
  auto r = WorkerRuntime::Create(
      {.attention = Shape(), .page_tokens = 4, .daemon_address = daemon, .arena_bytes = 1 << 28});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
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

TEST(RuntimeDaemonTest, DaemonKilledMidSequenceLosesNothingAndWorkersRejoin) {
  std::string dir = ::testing::TempDir() + "/runtime-restart";
  std::filesystem::create_directories(dir);
  const std::string sock = dir + "/kvtierd.sock";
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

}  // namespace
}  // namespace kvtier::worker
