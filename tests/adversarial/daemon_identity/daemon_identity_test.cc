// Attacks on a worker's trust in the daemon (issue 31, row 2): an impostor of another uid answers
// on the memory channel and relays to the real daemon, a socket directory others may write, and
// forged extents handed over by whoever answers. The real client refuses to talk to the impostor,
// naming the uid found and the uids expected, before it sends a secret; and it maps no
// descriptor that is not what the daemon makes. Each needs root (to be another uid, and to put
// the impostor's socket where the daemon's was).

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/adversarial/daemon_identity/channel_relay.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

constexpr uid_t kNobody = 65534;

// A daemon whose socket lies in a directory of the test's (root's, mode `mode`), that lets uid
// 65534 register too (so that a relay of that uid is served), with its real channel moved aside
// to `real_channel` (mode 0666), so that an impostor can take the channel's path and still reach
// the daemon.
struct ThrowawayDaemon {
  std::string dir, socket, channel, real_channel;
  std::unique_ptr<DaemonProcess> daemon;

  void Start(mode_t mode) {
    char tmpl[] = "/tmp/kvtier-relay-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    socket = dir + "/kvtierd.sock";
    channel = socket + ".mem";
    real_channel = dir + "/real.mem";
    auto d = DaemonProcess::Start(
        {.config_text = "[security]\nallow_uids = [0, 65534]\n", .socket_path = socket});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon = *std::move(d);
    ASSERT_EQ(rename(channel.c_str(), real_channel.c_str()), 0);
    ASSERT_EQ(chmod(real_channel.c_str(), 0666), 0);
    ASSERT_EQ(chmod(dir.c_str(), mode), 0);
  }
  ~ThrowawayDaemon() {
    daemon.reset();
    std::error_code ignored;
    if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
  }
};

SimWorkerOptions Worker(const std::string& address) {
  SimWorkerOptions o;
  o.address = address;
  o.background_heartbeat = false;
  o.heartbeat_over_channel = false;
  return o;
}

// Steps a connected worker until a plan needs pool memory (the client then fetches extents over
// the channel); the first error, or OK.
absl::Status StepUntilPooled(SimWorker& w) {
  absl::StatusOr<int> seq = w.Open();
  if (!seq.ok()) return seq.status();
  for (int i = 0; i < 6; ++i) {
    if (absl::Status s = w.Step(*seq, 160); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string Heard(const RelayReport& seen) {
  return absl::StrCat("the relay heard ", seen.requests, " requests (", seen.secrets,
                      " with a session secret), held ", seen.descriptors, " descriptors and read ",
                      seen.pages_read, " extents");
}

bool Contains(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

TEST(DaemonIdentityTest, AChannelRelayOfAnotherUidIsRefusedBeforeItHearsASecret) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to run the relay as uid 65534)";
  ThrowawayDaemon setup;
  ASSERT_NO_FATAL_FAILURE(setup.Start(0755));
  // The relay binds in a directory of its own and its socket is put at the channel's path, as
  // if it could write the daemon's socket directory; the directory itself stays safe, so only the
  // channel's peer credentials can tell.
  const std::string relay_dir = setup.dir + "/nobody";
  ASSERT_EQ(mkdir(relay_dir.c_str(), 0755), 0);
  ASSERT_EQ(chown(relay_dir.c_str(), kNobody, kNobody), 0);
  auto relay = ChannelRelay::Start({.listen_path = relay_dir + "/relay.mem",
                                    .upstream = setup.real_channel,
                                    .uid = kNobody,
                                    .gid = kNobody});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ASSERT_EQ(rename((relay_dir + "/relay.mem").c_str(), setup.channel.c_str()), 0);

  auto w = SimWorker::Connect(Worker(setup.daemon->address()));
  absl::Status pooled = w.ok() ? StepUntilPooled(**w) : w.status();
  const RelayReport seen = (*relay)->Report();
  EXPECT_EQ(seen.requests, 0) << Heard(seen);
  EXPECT_EQ(seen.pages_read, 0);
  ASSERT_FALSE(w.ok()) << "the client registered through the relay; pooled: " << pooled;
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnauthenticated) << w.status();
  EXPECT_TRUE(Contains(w.status(), "answered by uid 65534")) << w.status();
  EXPECT_TRUE(Contains(w.status(), "not the daemon's uid 0")) << w.status();
  EXPECT_TRUE(Contains(w.status(), setup.channel)) << w.status();

  // The same daemon, its channel back in place: the client talks to it.
  ASSERT_EQ(rename(setup.real_channel.c_str(), setup.channel.c_str()), 0);
  auto honest = SimWorker::Connect(Worker(setup.daemon->address()));
  ASSERT_TRUE(honest.ok()) << honest.status();
  EXPECT_TRUE(StepUntilPooled(**honest).ok());
  EXPECT_GT((*honest)->client().pool(v1::POOL_KIND_DDR)->mapped_extents(), 0u);
}

TEST(DaemonIdentityTest, ASocketDirectoryOthersMayWriteIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to run the relay as uid 65534)";
  ThrowawayDaemon setup;
  // Anyone may write the directory: uid 65534 binds its relay at the channel's path itself.
  ASSERT_NO_FATAL_FAILURE(setup.Start(0777));
  auto relay = ChannelRelay::Start({.listen_path = setup.channel,
                                    .upstream = setup.real_channel,
                                    .uid = kNobody,
                                    .gid = kNobody});
  ASSERT_TRUE(relay.ok()) << relay.status();

  auto w = SimWorker::Connect(Worker(setup.daemon->address()));
  absl::Status pooled = w.ok() ? StepUntilPooled(**w) : w.status();
  const RelayReport seen = (*relay)->Report();
  EXPECT_EQ(seen.requests, 0) << Heard(seen);
  ASSERT_FALSE(w.ok()) << "the client registered through the relay; pooled: " << pooled;
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnauthenticated) << w.status();
  EXPECT_TRUE(Contains(w.status(), absl::StrCat("socket directory ", setup.dir))) << w.status();
  EXPECT_TRUE(Contains(w.status(), "mode 0777")) << w.status();
}

// A relay of the client's own uid (it passes the peer check: a process of the same uid can read
// the client's memory anyway) stands for a daemon that hands over descriptors it should not.
class ForgedExtentTest : public ::testing::TestWithParam<RelayOptions::Forge> {};

TEST_P(ForgedExtentTest, AForgedExtentIsRefusedBeforeItIsMapped) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to move the daemon's channel aside)";
  ThrowawayDaemon setup;
  ASSERT_NO_FATAL_FAILURE(setup.Start(0700));
  auto relay = ChannelRelay::Start({.listen_path = setup.dir + "/relay.mem",
                                    .upstream = setup.real_channel,
                                    .uid = geteuid(),
                                    .gid = getegid(),
                                    .forge = GetParam()});
  ASSERT_TRUE(relay.ok()) << relay.status();
  ASSERT_EQ(rename((setup.dir + "/relay.mem").c_str(), setup.channel.c_str()), 0);

  auto w = SimWorker::Connect(Worker(setup.daemon->address()));
  ASSERT_TRUE(w.ok()) << w.status();
  absl::Status pooled = StepUntilPooled(**w);
  ASSERT_GT((*relay)->Report().descriptors, 1) << "no extent went through the relay";
  ASSERT_FALSE(pooled.ok()) << "the client mapped the forged extents";
  EXPECT_TRUE(Contains(pooled, "DDR pool extent 0") || Contains(pooled, "compressed pool extent 0"))
      << pooled;
  if (GetParam() == RelayOptions::Forge::kWrongSize) {
    EXPECT_TRUE(Contains(pooled, "bytes, found")) << pooled;
  } else {
    EXPECT_TRUE(Contains(pooled, "expected seals SEAL|SHRINK|GROW, found seals none")) << pooled;
  }
  EXPECT_EQ((*w)->client().pool(v1::POOL_KIND_DDR)->mapped_extents(), 0u);
  EXPECT_EQ((*w)->client().pool(v1::POOL_KIND_COMPRESSED)->mapped_extents(), 0u);
}

INSTANTIATE_TEST_SUITE_P(WrongSizeOrUnsealed, ForgedExtentTest,
                         ::testing::Values(RelayOptions::Forge::kWrongSize,
                                           RelayOptions::Forge::kUnsealed),
                         [](const auto& info) {
                           return info.param == RelayOptions::Forge::kWrongSize ? "WrongSize"
                                                                                : "Unsealed";
                         });

}  // namespace
}  // namespace kvtier::testing
