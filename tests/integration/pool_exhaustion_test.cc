// Pool memory the system will not give, against a real kvtierd: a file-size limit imposed on the
// running daemon (prlimit, as systemd's LimitFSIZE= would at start) makes every new memfd extent
// fail with EFBIG. Plans degrade and say why, naming the setting and its value; no page already
// stored is lost; every worker's requests keep succeeding, new workers included; once the limit
// is lifted the pools grow again.

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

// Sets the soft RLIMIT_FSIZE of `pid` (the hard limit stays: raising it back needs
// CAP_SYS_RESOURCE).
absl::Status LimitFileSize(pid_t pid, rlim_t bytes) {
  rlimit limit{};
  if (prlimit(pid, RLIMIT_FSIZE, nullptr, &limit) != 0) {
    return absl::InternalError(absl::StrCat("prlimit(", pid, "): ", std::strerror(errno)));
  }
  limit.rlim_cur = std::min(bytes, limit.rlim_max);
  if (prlimit(pid, RLIMIT_FSIZE, &limit, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("prlimit(", pid, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::unique_ptr<SimWorker> Worker(const DaemonProcess& daemon, uint64_t seed) {
  auto w = SimWorker::Connect({.address = daemon.address(), .seed = seed});
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

uint32_t DdrExtents(SimWorker& w) {
  auto pool = w.client().pool(v1::POOL_KIND_DDR);
  return pool == nullptr ? 0 : pool->mapped_extents();
}

TEST(PoolExhaustionTest, PoolsTheSystemWillNotGrowDegradePlansNamingWhyAndLoseNothing) {
  const int port = *FreeLoopbackPort();
  // 1 MiB extents, budgets of fewer than 8 (no spares made ahead): every extent a plan needs is
  // made when it is needed.
  auto daemon = DaemonProcess::Start({.config_text = "extent_mib = 1\n",
                                      .metrics_address = absl::StrCat("127.0.0.1:", port),
                                      .ddr_mib = 6,
                                      .compressed_mib = 3});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto a = Worker(**daemon, 1), b = Worker(**daemon, 2);
  ASSERT_TRUE(a && b);
  auto sa = a->Open(), sb = b->Open();
  ASSERT_TRUE(sa.ok() && sb.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a->Step(*sa, 160).ok());
    ASSERT_TRUE(b->Step(*sb, 160).ok());
  }
  ASSERT_GT(DdrExtents(*a), 0u);
  ASSERT_GT(DdrExtents(*b), 0u);
  ASSERT_EQ(a->stats().degraded + b->stats().degraded, 0u) << a->stats().degraded_reason;
  const uint32_t ddr_extents = DdrExtents(*a) + DdrExtents(*b);

  // Files (memfds included) may no longer grow past 256 KiB: no new 1 MiB extent.
  ASSERT_TRUE(LimitFileSize((*daemon)->pid(), 256 << 10).ok());
  // A new worker registers (its pool headers are one page) and tiers, degraded, saying why.
  auto c = Worker(**daemon, 3);
  ASSERT_TRUE(c);
  auto sc = c->Open();
  ASSERT_TRUE(sc.ok()) << sc.status();
  for (int i = 0; i < 4; ++i) {
    absl::Status s = c->Step(*sc, 160);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(DdrExtents(*c), 0u);
  EXPECT_GT(c->stats().degraded, 0u);
  const std::string& why = c->stats().degraded_reason;
  std::printf("degraded: %s\n", why.c_str());
  EXPECT_NE(why.find("DDR pool full"), std::string::npos) << why;
  EXPECT_NE(why.find("File too large"), std::string::npos) << why;
  EXPECT_NE(why.find("extents of 1048576 bytes (pools.extent_mib), memfd"), std::string::npos)
      << why;
  EXPECT_NE(why.find("no extra eviction"), std::string::npos) << why;
  // The workers that hold memory go on: every step verifies every page they stored before.
  // Until their extents are full, then some more.
  for (int i = 0; i < 60 && a->stats().degraded + b->stats().degraded < 4; ++i) {
    absl::Status s = a->Step(*sa, 160);
    ASSERT_TRUE(s.ok()) << s;
    s = b->Step(*sb, 160);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_GE(a->stats().degraded + b->stats().degraded, 4u) << "their extents never filled up";
  EXPECT_EQ(DdrExtents(*a) + DdrExtents(*b), ddr_extents) << "an extent was made past the limit";
  EXPECT_GT(ScrapeMetric(port, "kvtier_pool_allocation_failures_total"), 0);

  // The limit lifted: the next plans get extents again.
  ASSERT_TRUE(LimitFileSize((*daemon)->pid(), RLIM_INFINITY).ok());
  const uint64_t degraded = c->stats().degraded;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c->Step(*sc, 160).ok());
  EXPECT_GT(DdrExtents(*c), 0u);
  EXPECT_LT(c->stats().degraded - degraded, 4u) << c->stats().degraded_reason;
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
}

}  // namespace
}  // namespace kvtier::testing
