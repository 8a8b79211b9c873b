#include "daemon/kvtierd/reload.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace kvtier::daemon {
namespace {

class Differ {
 public:
  explicit Differ(std::vector<std::string>* out) : out_(out) {}

  void Text(const char* key, const std::string& a, const std::string& b) {
    if (a != b) out_->push_back(absl::StrCat(key, " \"", a, "\" -> \"", b, "\""));
  }
  void Number(const char* key, uint64_t a, uint64_t b) {
    if (a != b) out_->push_back(absl::StrCat(key, " ", a, " -> ", b));
  }
  void Ratio(const char* key, double a, double b) {
    if (a != b) out_->push_back(absl::StrCat(key, " ", a, " -> ", b));
  }
  void Millis(const char* key, absl::Duration a, absl::Duration b) {
    Number(key, absl::ToInt64Milliseconds(a), absl::ToInt64Milliseconds(b));
  }
  void Ids(const char* key, const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    if (a != b) {
      out_->push_back(
          absl::StrCat(key, " [", absl::StrJoin(a, ", "), "] -> [", absl::StrJoin(b, ", "), "]"));
    }
  }
  void Mode(const char* key, uint32_t a, uint32_t b) {
    if (a != b) out_->push_back(absl::StrFormat("%s %04o -> %04o", key, a, b));
  }

 private:
  std::vector<std::string>* const out_;
};

}  // namespace

ConfigChanges DiffConfigs(const DaemonConfig& running, const DaemonConfig& fresh) {
  ConfigChanges changes;
  Differ now(&changes.applied);
  now.Text("server.log_level", std::string(LogLevelName(running.server.log_level)),
           std::string(LogLevelName(fresh.server.log_level)));
  const CoreOptions& a = running.core;
  const CoreOptions& b = fresh.core;
  now.Number("limits.max_workers", a.max_workers, b.max_workers);
  now.Number("limits.max_sequences_per_worker", a.max_sequences_per_worker,
             b.max_sequences_per_worker);
  now.Number("limits.max_sequences", a.max_sequences, b.max_sequences);
  now.Number("limits.worker_ddr_quota_mib", a.worker_ddr_quota_bytes >> 20,
             b.worker_ddr_quota_bytes >> 20);
  now.Number("limits.worker_compressed_quota_mib", a.worker_compressed_quota_bytes >> 20,
             b.worker_compressed_quota_bytes >> 20);
  now.Millis("leases.ttl_ms", a.lease_ttl, b.lease_ttl);
  now.Millis("leases.heartbeat_ms", a.heartbeat_interval, b.heartbeat_interval);
  now.Ids("security.allow_uids", a.security.allow_uids, b.security.allow_uids);
  now.Ids("security.allow_gids", a.security.allow_gids, b.security.allow_gids);
  now.Ids("security.operator_uids", a.security.operator_uids, b.security.operator_uids);

  Differ later(&changes.needs_restart);
  later.Text("server.socket", running.server.socket_path, fresh.server.socket_path);
  later.Text("server.tcp", running.server.tcp_address, fresh.server.tcp_address);
  later.Text("server.metrics", running.server.metrics_address, fresh.server.metrics_address);
  later.Millis("server.reap_interval_ms", running.server.reap_interval, fresh.server.reap_interval);
  later.Number("server.policy_threads", running.server.policy_threads, fresh.server.policy_threads);
  later.Millis("server.unread_timeout_ms", running.server.unread_timeout,
               fresh.server.unread_timeout);
  later.Number("server.heartbeat_priority", running.server.heartbeat_priority,
               fresh.server.heartbeat_priority);
  later.Number("server.max_connections", running.server.max_connections,
               fresh.server.max_connections);
  later.Number("server.max_connections_per_uid", running.server.max_connections_per_uid,
               fresh.server.max_connections_per_uid);
  later.Number("server.max_tcp_connections", running.server.max_tcp_connections,
               fresh.server.max_tcp_connections);
  later.Number("server.max_concurrent_streams", running.server.max_concurrent_streams,
               fresh.server.max_concurrent_streams);
  later.Number("server.grpc_memory_mib", running.server.grpc_memory_mib,
               fresh.server.grpc_memory_mib);
  later.Millis("server.idle_timeout_ms", running.server.idle_timeout, fresh.server.idle_timeout);
  later.Number("pools.ddr_mib", a.ddr_pool_bytes >> 20, b.ddr_pool_bytes >> 20);
  later.Number("pools.compressed_mib", a.compressed_pool_bytes >> 20,
               b.compressed_pool_bytes >> 20);
  later.Text("pools.shm_prefix", a.shm_prefix, b.shm_prefix);
  later.Text("pools.group", a.shm_group, b.shm_group);
  later.Mode("pools.mode", a.shm_mode, b.shm_mode);
  later.Number("pools.extent_mib", a.extent_bytes >> 20, b.extent_bytes >> 20);
  later.Text("pools.extent_dir", a.extent_dir, b.extent_dir);
  later.Text("pools.backend", a.pool_backend, b.pool_backend);
  later.Text("pools.cuda_library", a.cuda_library, b.cuda_library);
  later.Text("pools.numa_node", absl::StrCat(a.numa_node), absl::StrCat(b.numa_node));
  later.Millis("schedules.assumed_step_ms", a.assumed_step, b.assumed_step);
  later.Number("limits.max_snapshot_entries", a.max_snapshot_entries, b.max_snapshot_entries);
  later.Text("policy.name", running.policy.name, fresh.policy.name);
  later.Ratio("policy.hbm_ratio", running.policy.hbm_ratio, fresh.policy.hbm_ratio);
  later.Ratio("policy.evict_ratio", running.policy.evict_ratio, fresh.policy.evict_ratio);
  later.Ratio("policy.compress_ratio", running.policy.compress_ratio, fresh.policy.compress_ratio);
  return changes;
}

DaemonConfig ApplyReloadable(const DaemonConfig& running, const DaemonConfig& fresh) {
  DaemonConfig next = running;
  next.server.log_level = fresh.server.log_level;
  next.core.max_workers = fresh.core.max_workers;
  next.core.max_sequences_per_worker = fresh.core.max_sequences_per_worker;
  next.core.max_sequences = fresh.core.max_sequences;
  next.core.security.allow_uids = fresh.core.security.allow_uids;
  next.core.security.allow_gids = fresh.core.security.allow_gids;
  next.core.security.operator_uids = fresh.core.security.operator_uids;
  next.core.worker_ddr_quota_bytes = fresh.core.worker_ddr_quota_bytes;
  next.core.worker_compressed_quota_bytes = fresh.core.worker_compressed_quota_bytes;
  next.core.lease_ttl = fresh.core.lease_ttl;
  next.core.heartbeat_interval = fresh.core.heartbeat_interval;
  return next;
}

}  // namespace kvtier::daemon
