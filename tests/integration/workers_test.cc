// Many worker processes against one real kvtierd: plans keep every page's bytes intact, pools
// balance to zero, a killed worker's slots come back, a restarted daemon is re-joined.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::SimWorker;
using testing::SimWorkerOptions;

// Runs `body` in a child process; returns the pid. The child exits 0 when body returns OK and
// prints the error otherwise.
template <typename Body>
pid_t Fork(Body body) {
  pid_t pid = fork();
  if (pid == 0) {
    absl::Status s = body();
    if (!s.ok()) std::fprintf(stderr, "worker %d: %s\n", getpid(), s.ToString().c_str());
    _exit(s.ok() ? 0 : 1);
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

uint64_t PoolBytesUsed(WorkerClient& client) {
  auto status = client.GetStatus(false, false);
  uint64_t used = 0;
  for (const auto& p : status->pools()) used += p.used_bytes();
  return used;
}

absl::Status RunWorker(const std::string& address, int index, int sequences, int steps) {
  SimWorkerOptions options{.address = address, .seed = static_cast<uint64_t>(index + 1)};
  options.name = absl::StrCat("w", index);
  auto worker = SimWorker::Connect(options);
  if (!worker.ok()) return worker.status();
  std::vector<int> ids;
  for (int s = 0; s < sequences; ++s) {
    auto id = (*worker)->Open();
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  for (int step = 0; step < steps; ++step) {
    for (int id : ids) {
      if (auto s = (*worker)->Step(id, 64); !s.ok()) return s;
    }
  }
  for (int id : ids) {
    if (auto s = (*worker)->Close(id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(WorkersTest, ConcurrentWorkerProcessesKeepEveryPageIntactAndPoolsBalance) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();
  std::vector<pid_t> pids;
  for (int w = 0; w < 6; ++w) {
    pids.push_back(Fork([&, w] { return RunWorker(address, w, 3, 12); }));
  }
  for (pid_t pid : pids) EXPECT_EQ(WaitExit(pid), 0) << (*daemon)->Log();
  auto observer = SimWorker::Connect({.address = address});
  ASSERT_TRUE(observer.ok()) << observer.status();
  EXPECT_EQ(PoolBytesUsed((*observer)->client()), 0u);
  auto status = (*observer)->client().GetStatus(true, true);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->sequences(), 0u);
}

TEST(WorkersTest, KilledWorkerSlotsReturnAfterTheLeaseAndOthersAreUnaffected) {
  auto daemon = DaemonProcess::Start({.config_text = "[leases]\nttl_ms = 300\nheartbeat_ms = 50\n"
                                                     "[server]\nreap_interval_ms = 50\n"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t victim = Fork([&]() -> absl::Status {
    auto w = SimWorker::Connect({.address = address, .name = "victim"});
    if (!w.ok()) return w.status();
    auto id = (*w)->Open();
    if (!id.ok()) return id.status();
    for (int i = 0; i < 10; ++i) {
      if (auto s = (*w)->Step(*id, 64); !s.ok()) return s;
    }
    char c = 1;
    (void)!write(ready[1], &c, 1);
    pause();  // holding slots until killed
    return absl::OkStatus();
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);

  auto survivor = SimWorker::Connect({.address = address, .name = "survivor", .seed = 9});
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  auto id = (*survivor)->Open();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*survivor)->Step(*id, 256).ok());
  const uint64_t survivor_bytes_before_kill = PoolBytesUsed((*survivor)->client());
  ASSERT_GT(survivor_bytes_before_kill, 0u);

  kill(victim, SIGKILL);
  EXPECT_EQ(WaitExit(victim), 128 + SIGKILL);
  // Within a few TTLs the victim's slots are back; the survivor holds only its own.
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  uint64_t workers = 0;
  while (absl::Now() < deadline) {
    auto st = (*survivor)->client().GetStatus(false, false);
    workers = st->workers();
    if (workers == 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(workers, 1u) << (*daemon)->Log();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*survivor)->Step(*id, 64).ok());
  ASSERT_TRUE((*survivor)->Close(*id).ok());
  EXPECT_EQ(PoolBytesUsed((*survivor)->client()), 0u);
  EXPECT_NE((*daemon)->Log().find("lease expired"), std::string::npos) << (*daemon)->Log();
}

TEST(WorkersTest, WorkerReRegistersAfterDaemonRestart) {
  std::string dir = ::testing::TempDir() + "/restart";
  std::filesystem::create_directories(dir);
  const std::string sock = dir + "/kvtierd.sock";
  auto daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto w = SimWorker::Connect({.address = "unix:" + sock});
  ASSERT_TRUE(w.ok()) << w.status();
  auto id = (*w)->Open();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*w)->Step(*id, 300).ok());
  const uint64_t generation = (*w)->client().generation();

  ASSERT_EQ((*daemon)->Stop(SIGTERM), 0);
  // The daemon is gone: calls fail quickly instead of hanging the worker.
  EXPECT_FALSE((*w)->Step(*id, 64).ok());
  daemon = DaemonProcess::Start({.socket_path = sock});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && (*w)->client().generation() == generation) {
    (void)(*w)->client().HeartbeatOnce();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT((*w)->client().generation(), generation);
  EXPECT_TRUE((*w)->client().connected());
  (*w)->Forget(*id);  // the new daemon does not know it
  auto fresh = (*w)->Open();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*w)->Step(*fresh, 200).ok());
}

}  // namespace
}  // namespace kvtier
