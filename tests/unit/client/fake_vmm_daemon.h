#ifndef KVTIER_TESTS_UNIT_CLIENT_FAKE_VMM_DAEMON_H_
#define KVTIER_TESTS_UNIT_CLIENT_FAKE_VMM_DAEMON_H_

// The client tests' daemon: a real core (pools.backend resolved over the fake CUDA driver,
// which must outlive it) and a real memory channel at `channel_path`. Not thread-safe.

#include <unistd.h>

#include <memory>
#include <string>

#include "daemon/kvtierd/channel_server.h"
#include "daemon/pool_backend.h"
#include "gtest/gtest.h"
#include "tests/support/fake_cuda_driver.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::testing {

struct FakeVmmDaemon {
  // Call under ASSERT_NO_FATAL_FAILURE.
  void Start(const std::string& backend, const std::string& channel) {
    options = daemon::testing::SmallOptions(32ull << 20, 32ull << 20);
    options.pool_backend = backend;
    ASSERT_TRUE(daemon::ResolvePoolBackend(&options, [] {
                  return edge::cuda::Driver::FromTable(FakeCudaDriver::Table());
                }).ok());
    env = std::make_unique<daemon::testing::Env>(options);
    ASSERT_NE(env->core, nullptr);
    channel_path = channel;
    auto listener = edge::ListenChannel(channel_path, 0600, static_cast<gid_t>(-1));
    ASSERT_TRUE(listener.ok()) << listener.status();
    server = std::make_unique<daemon::ChannelServer>(
        *std::move(listener), env->core.get(), daemon::ChannelLaneOptions{},
        daemon::ChannelLaneOptions{}, [](const std::string&) {}, [](const std::string&) {},
        [](const std::string&) {});
  }
  ~FakeVmmDaemon() {
    server.reset();
    if (!channel_path.empty()) unlink(channel_path.c_str());
  }

  daemon::CoreOptions options;
  std::unique_ptr<daemon::testing::Env> env;
  std::string channel_path;
  std::unique_ptr<daemon::ChannelServer> server;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_UNIT_CLIENT_FAKE_VMM_DAEMON_H_
