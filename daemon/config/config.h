#ifndef KVTIER_DAEMON_CONFIG_CONFIG_H_
#define KVTIER_DAEMON_CONFIG_CONFIG_H_

// kvtierd's configuration: a TOML file (deploy/kvtierd.toml documents every key) plus
// command-line overrides. The packaged file is embedded in the binary as the defaults.

#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/daemon_core.h"
#include "edge/daemon_socket.h"

namespace kvtier::daemon {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// server.metrics = "auto" (the default): the host's daemon, the one on edge::kDefaultSocketPath,
// serves metrics on kHostMetricsAddress (where the packaged Prometheus scrape file looks); any
// other daemon serves none unless configured, so several daemons on a host never collide.
inline constexpr char kMetricsAuto[] = "auto";
inline constexpr char kHostMetricsAddress[] = "127.0.0.1:9464";

struct ServerOptions {
  std::string socket_path = edge::kDefaultSocketPath;
  std::string tcp_address;                     // empty = off; loopback only
  std::string metrics_address = kMetricsAuto;  // empty = off; "auto"; host:port
  LogLevel log_level = LogLevel::kInfo;
  absl::Duration reap_interval = absl::Milliseconds(500);
  int policy_threads = 2;  // threads that run snapshots; 0 = gRPC's callback threads
  // A connection whose peer left the daemon's answers unread this long is dropped
  // (daemon/kvtierd/unread_guard.h); 0 = never.
  absl::Duration unread_timeout = absl::Seconds(2);
  // SCHED_FIFO priorities of the threads that answer heartbeats, and snapshots, on the memory
  // channel (daemon/kvtierd/channel_lane.h); 0 = the default policy.
  int heartbeat_priority = 1;
  int snapshot_priority = 1;
  // The memory channel's connections waiting for their request (daemon/kvtierd/channel_server.h):
  // all peers together, and per uid; one that has not sent a whole request within the timeout is
  // dropped.
  int channel_connections = 512;
  int channel_connections_per_uid = 64;
  absl::Duration channel_request_timeout = absl::Milliseconds(500);
  // gRPC connections open at once (daemon/kvtierd/grpc_acceptor.h): in all (and never above
  // half of RLIMIT_NOFILE), per uid of a unix peer, and over TCP; one over is refused.
  int max_connections = 1024;
  int max_connections_per_uid = 128;
  int max_tcp_connections = 64;
  // HTTP/2 streams (calls in flight) per gRPC connection.
  int max_concurrent_streams = 16;
  // Bytes gRPC may buffer in all (its ResourceQuota), MiB.
  int grpc_memory_mib = 256;
  // A gRPC connection with no call this long is closed (the client reconnects); 0 = never.
  absl::Duration idle_timeout = absl::Minutes(5);
};

// Defaults applied to OpenSequence requests that name no policy.
struct PolicyDefaults {
  std::string name = "hierarchy";
  double hbm_ratio = 0.5;
  double evict_ratio = 0.0;
  double compress_ratio = 0.0;
  // ε (docs/tiering.md, "Quality guardrail"): absent = no limit.
  double max_lost_mass = std::numeric_limits<double>::infinity();
};

struct DaemonConfig {
  ServerOptions server;
  CoreOptions core;
  PolicyDefaults policy;
};

// The packaged deploy/kvtierd.toml, compiled in.
std::string_view DefaultConfigText();

// Parses TOML text. `source` names it in errors ("/etc/kvtier/kvtierd.toml"). Keys missing from
// `text` keep their defaults; an unknown key, a wrong type or an out-of-range value is
// INVALID_ARGUMENT naming the source, the line, the key and the value.
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view text, std::string_view source);

// Reads and parses a file; NOT_FOUND when it cannot be read.
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);

// What server.metrics means for a daemon serving `socket_path`: "" (off) or host:port.
std::string ResolveMetricsAddress(const std::string& metrics, const std::string& socket_path);

std::string_view LogLevelName(LogLevel level);
absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CONFIG_CONFIG_H_
