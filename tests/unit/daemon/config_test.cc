#include "daemon/config/config.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

// server.metrics = "auto": only the host's daemon (the default socket) takes the shared port.
TEST(ConfigTest, AutoMetricsServeTheHostDaemonOnlyAndExplicitValuesStay) {
  EXPECT_EQ(DaemonConfig{}.server.metrics_address, "auto");
  EXPECT_EQ(ResolveMetricsAddress("auto", "/run/kvtier/kvtierd.sock"), "127.0.0.1:9464");
  EXPECT_EQ(ResolveMetricsAddress("auto", "/tmp/second/kvtierd.sock"), "");
  EXPECT_EQ(ResolveMetricsAddress("auto", "kvtierd.sock"), "");
  EXPECT_EQ(ResolveMetricsAddress("127.0.0.1:9999", "/tmp/k.sock"), "127.0.0.1:9999");
  EXPECT_EQ(ResolveMetricsAddress("", "/run/kvtier/kvtierd.sock"), "");
}

TEST(ConfigTest, PackagedDefaultsParseToTheBuiltInDefaults) {
  auto parsed = ParseConfig(DefaultConfigText(), "kvtierd.toml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  DaemonConfig built_in;
  EXPECT_EQ(parsed->server.socket_path, built_in.server.socket_path);
  EXPECT_EQ(parsed->server.metrics_address, built_in.server.metrics_address);
  EXPECT_EQ(parsed->core.ddr_pool_bytes, built_in.core.ddr_pool_bytes);
  EXPECT_EQ(parsed->core.compressed_pool_bytes, built_in.core.compressed_pool_bytes);
  EXPECT_EQ(parsed->core.lease_ttl, built_in.core.lease_ttl);
  EXPECT_EQ(parsed->core.shm_mode, built_in.core.shm_mode);
  EXPECT_EQ(parsed->policy.name, built_in.policy.name);
  EXPECT_EQ(parsed->policy.hbm_ratio, built_in.policy.hbm_ratio);
  EXPECT_EQ(parsed->server.unread_timeout, built_in.server.unread_timeout);
  EXPECT_EQ(parsed->server.heartbeat_priority, built_in.server.heartbeat_priority);
  EXPECT_EQ(parsed->server.snapshot_priority, built_in.server.snapshot_priority);
  EXPECT_EQ(parsed->server.channel_connections, built_in.server.channel_connections);
  EXPECT_EQ(parsed->server.channel_connections_per_uid,
            built_in.server.channel_connections_per_uid);
  EXPECT_EQ(parsed->server.channel_request_timeout, built_in.server.channel_request_timeout);
  EXPECT_EQ(parsed->server.max_connections, built_in.server.max_connections);
  EXPECT_EQ(parsed->server.max_connections_per_uid, built_in.server.max_connections_per_uid);
  EXPECT_EQ(parsed->server.max_tcp_connections, built_in.server.max_tcp_connections);
  EXPECT_EQ(parsed->server.max_concurrent_streams, built_in.server.max_concurrent_streams);
  EXPECT_EQ(parsed->server.grpc_memory_mib, built_in.server.grpc_memory_mib);
  EXPECT_EQ(parsed->server.idle_timeout, built_in.server.idle_timeout);
  EXPECT_EQ(parsed->core.pool_backend, built_in.core.pool_backend);
  EXPECT_EQ(parsed->core.numa_node, built_in.core.numa_node);
  EXPECT_EQ(parsed->core.cuda_library, built_in.core.cuda_library);
  EXPECT_EQ(parsed->core.max_worker_entries, built_in.core.max_worker_entries);
  EXPECT_EQ(parsed->core.max_node_entries, built_in.core.max_node_entries);
  EXPECT_TRUE(parsed->core.links.empty());
  // Operators: none but the daemon's own uid (root pods are tenants too).
  EXPECT_EQ(parsed->core.security.operator_uids, built_in.core.security.operator_uids);
  EXPECT_TRUE(built_in.core.security.operator_uids.empty());
}

TEST(ConfigTest, ReadsEntryBudgetsAndTheOperatorsLinkTable) {
  auto c = ParseConfig(R"(
[limits]
max_worker_entries = 4096
max_node_entries = 65536
[links]
sw0 = { bytes_per_second = 5.5e10, numa_node = 1 }
"0000:3a:00.0" = { bytes_per_second = 25000000000 }
)",
                       "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->core.max_worker_entries, 4096u);
  EXPECT_EQ(c->core.max_node_entries, 65536u);
  ASSERT_EQ(c->core.links.size(), 2u);
  for (const LinkEntry& l : c->core.links) {
    if (l.id == "sw0") {
      EXPECT_DOUBLE_EQ(l.bytes_per_second, 5.5e10);
      EXPECT_EQ(l.numa_node, 1u);
    } else {
      EXPECT_EQ(l.id, "0000:3a:00.0");
      EXPECT_DOUBLE_EQ(l.bytes_per_second, 2.5e10);
      EXPECT_EQ(l.numa_node, 0u);
    }
  }
}

TEST(ConfigTest, ReadsEveryPoolBackendAndANumaNode) {
  for (const char* backend : {"auto", "memfd", "cuda_vmm"}) {
    auto c = ParseConfig(absl::StrCat("[pools]\nbackend = \"", backend, "\"\nnuma_node = 1\n"),
                         "t.toml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->core.pool_backend, backend);
    EXPECT_EQ(c->core.numa_node, 1);
  }
  auto c = ParseConfig("[pools]\ncuda_library = \"/opt/fake/libcuda.so.1\"\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->core.cuda_library, "/opt/fake/libcuda.so.1");
}

TEST(ConfigTest, ReadsEveryKindOfValue) {
  auto c = ParseConfig(R"(
[server]
socket = "/tmp/x.sock"
log_level = "debug"
unread_timeout_ms = 0
heartbeat_priority = 0
snapshot_priority = 2
channel_connections = 100
channel_connections_per_uid = 8
channel_request_timeout_ms = 250
max_connections = 100
max_connections_per_uid = 4
max_tcp_connections = 0
max_concurrent_streams = 8
grpc_memory_mib = 64
idle_timeout_ms = 0
[pools]
ddr_mib = 64
mode = "0600"
[leases]
ttl_ms = 1500
heartbeat_ms = 500
[security]
allow_uids = [1000, 1001]
operator_uids = []
[policy]
evict_ratio = 0.03
)",
                       "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.socket_path, "/tmp/x.sock");
  EXPECT_EQ(c->server.log_level, LogLevel::kDebug);
  EXPECT_EQ(c->server.unread_timeout, absl::ZeroDuration());
  EXPECT_EQ(c->server.heartbeat_priority, 0);
  EXPECT_EQ(c->server.snapshot_priority, 2);
  EXPECT_EQ(c->server.channel_connections, 100);
  EXPECT_EQ(c->server.channel_connections_per_uid, 8);
  EXPECT_EQ(c->server.channel_request_timeout, absl::Milliseconds(250));
  EXPECT_EQ(c->server.max_connections, 100);
  EXPECT_EQ(c->server.max_connections_per_uid, 4);
  EXPECT_EQ(c->server.max_tcp_connections, 0);
  EXPECT_EQ(c->server.max_concurrent_streams, 8);
  EXPECT_EQ(c->server.grpc_memory_mib, 64);
  EXPECT_EQ(c->server.idle_timeout, absl::ZeroDuration());
  EXPECT_EQ(c->core.ddr_pool_bytes, 64ull << 20);
  EXPECT_EQ(c->core.shm_mode, 0600u);
  EXPECT_EQ(c->core.security.allow_uids, (std::vector<uint32_t>{1000, 1001}));
  EXPECT_TRUE(c->core.security.operator_uids.empty());
  EXPECT_EQ(c->core.lease_ttl, absl::Milliseconds(1500));
  EXPECT_DOUBLE_EQ(c->policy.evict_ratio, 0.03);
}

struct BadCase {
  const char* text;
  const char* must_mention;
};

class ConfigRejectsTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigRejectsTest, NamesTheProblem) {
  auto c = ParseConfig(GetParam().text, "bad.toml");
  ASSERT_FALSE(c.ok()) << GetParam().text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(GetParam().must_mention), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("bad.toml"), std::string::npos) << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigRejectsTest,
    ::testing::Values(
        BadCase{"[pools]\nddr_mb = 5\n", "pools.ddr_mb"},
        BadCase{"[pool]\nddr_mib = 5\n", "pool.ddr_mib"},
        BadCase{"[pools]\nddr_mib = \"big\"\n", "pools.ddr_mib"},
        BadCase{"[pools]\nddr_mib = 0\n", "out of range"},
        BadCase{"[pools]\nmode = \"999\"\n", "pools.mode"},
        BadCase{"[pools]\nshm_prefix = \"a/b\"\n", "pools.shm_prefix"},
        BadCase{"[pools]\nmode = \"0666\"\n", "world-accessible"},
        BadCase{"[pools]\nbackend = \"vmm\"\n", "pools.backend = \"vmm\" must be"},
        BadCase{"[pools]\nbackend = 1\n", "pools.backend = must be \"auto\""},
        BadCase{"[pools]\nnuma_node = -2\n", "pools.numa_node = -2"},
        BadCase{"[pools]\ncuda_library = \"\"\n",
                "pools.cuda_library = \"\" must be a library name"},
        BadCase{"[leases]\nttl_ms = 2000\nheartbeat_ms = 2000\n", "must exceed"},
        BadCase{"[security]\nallow_uids = [\"root\"]\n", "security.allow_uids"},
        BadCase{"[security]\noperator_uids = 0\n", "security.operator_uids"},
        BadCase{"[limits]\nmax_snapshot_entries = 0\n", "max_snapshot_entries"},
        BadCase{"[limits]\nmax_worker_entries = 0\n", "limits.max_worker_entries"},
        BadCase{"[limits]\nmax_node_entries = -1\n", "limits.max_node_entries"},
        BadCase{"[links]\nsw0 = 5\n", "links.\"sw0\" must be a table"},
        BadCase{"[links]\nsw0 = { bytes_per_second = 0 }\n", "bytes_per_second = 0"},
        BadCase{"[links]\nsw0 = { bytes_per_second = 1e9, numa_node = 1024 }\n",
                "numa_node = 1024"},
        BadCase{"[links]\nsw0 = { numa_node = 0 }\n", "needs bytes_per_second"},
        BadCase{"[links]\nsw0 = { bytes_per_second = 1e9, speed = 1 }\n", "speed"},
        BadCase{"[policy]\nhbm_ratio = 1.5\n", "policy.hbm_ratio"},
        BadCase{"[policy]\nevict_ratio = 0.6\ncompress_ratio = 0.6\n", "exceeds 1"},
        BadCase{"[server]\nlog_level = \"loud\"\n", "server.log_level"},
        BadCase{"[server]\nunread_timeout_ms = -1\n", "server.unread_timeout_ms"},
        BadCase{"[server]\nheartbeat_priority = 100\n", "server.heartbeat_priority = 100"},
        BadCase{"[server]\nsnapshot_priority = -1\n", "server.snapshot_priority = -1"},
        BadCase{"[server]\nchannel_connections_per_uid = 0\n",
                "server.channel_connections_per_uid = 0"},
        BadCase{"[server]\nchannel_request_timeout_ms = 5\n",
                "server.channel_request_timeout_ms = 5"},
        BadCase{"[server]\nmax_connections_per_uid = 0\n", "server.max_connections_per_uid = 0"},
        BadCase{"[server]\nmax_concurrent_streams = 0\n", "server.max_concurrent_streams = 0"},
        BadCase{"[server]\ngrpc_memory_mib = 1\n", "server.grpc_memory_mib = 1"},
        BadCase{"[server]\nidle_timeout_ms = -5\n", "server.idle_timeout_ms = -5"},
        BadCase{"socket = \"/x\"\n", "socket"}, BadCase{"[server\n", "bad.toml:1"}));

TEST(ConfigTest, ErrorsCarryTheLineNumber) {
  auto c = ParseConfig("[server]\nsocket = \"/x\"\n\n[leases]\nttl_ms = -3\n", "f.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("f.toml:5: leases.ttl_ms"), std::string::npos)
      << c.status().message();
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadConfigFile("/nonexistent/kvtierd.toml").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier::daemon
