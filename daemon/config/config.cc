#include "daemon/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "daemon/link_schedule.h"
#include "daemon/pool_backend.h"

namespace kvtier::daemon {
namespace {

// Where a value came from, for error messages: "kvtierd.toml:12: pools.ddr_mib".
std::string Where(const std::string& source, const toml::node& node, const std::string& key) {
  return absl::StrCat(source, ":", static_cast<uint64_t>(node.source().begin.line), ": ", key);
}

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, " ", what));
}

// One setter per known key. Each checks the node's type and range and stores the value.
using Setter = std::function<absl::Status(const toml::node&, const std::string& where)>;

Setter String(std::string* out) {
  return [out](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    if (!v || !n.is_string()) return Bad(where, "must be a string");
    *out = *v;
    return absl::OkStatus();
  };
}

Setter Integer(std::function<void(int64_t)> store, int64_t min, int64_t max) {
  return [store, min, max](const toml::node& n, const std::string& where) -> absl::Status {
    if (!n.is_integer()) return Bad(where, "must be an integer");
    int64_t v = *n.value<int64_t>();
    if (v < min || v > max) {
      return Bad(where, absl::StrCat("= ", v, " is out of range [", min, ", ", max, "]"));
    }
    store(v);
    return absl::OkStatus();
  };
}

Setter Ratio(double* out) {
  return [out](const toml::node& n, const std::string& where) -> absl::Status {
    if (!n.is_floating_point() && !n.is_integer()) return Bad(where, "must be a number");
    double v = *n.value<double>();
    if (!(v >= 0.0 && v <= 1.0)) return Bad(where, absl::StrCat("= ", v, " is outside [0, 1]"));
    *out = v;
    return absl::OkStatus();
  };
}

Setter Millis(absl::Duration* out, int64_t min_ms) {
  return Integer([out](int64_t v) { *out = absl::Milliseconds(v); }, min_ms, 86'400'000);
}

Setter Mebibytes(uint64_t* out, int64_t min_mib) {
  return Integer([out](int64_t v) { *out = static_cast<uint64_t>(v) << 20; }, min_mib,
                 int64_t{1} << 30);
}

// A list of uids or gids: integers in [0, 2^32 - 2].
Setter Ids(std::vector<uint32_t>* out) {
  return [out](const toml::node& n, const std::string& where) -> absl::Status {
    const toml::array* a = n.as_array();
    if (a == nullptr) return Bad(where, "must be a list of numeric ids, e.g. [0, 1000]");
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (!e.is_integer() || *e.value<int64_t>() < 0 || *e.value<int64_t>() >= 0xFFFFFFFFll) {
        return Bad(where, absl::StrCat("[", i, "] must be a numeric id >= 0"));
      }
      ids.push_back(static_cast<uint32_t>(*e.value<int64_t>()));
    }
    *out = std::move(ids);
    return absl::OkStatus();
  };
}

// [links]: one key per link_id, each an inline table { bytes_per_second = 5.5e10, numa_node = 0 }.
absl::Status ParseLinks(const std::string& source, const toml::table& table,
                        std::vector<LinkEntry>* out) {
  for (auto&& [key, value] : table) {
    LinkEntry e;
    e.id = std::string(key.str());
    const std::string where = Where(source, value, absl::StrCat("links.\"", e.id, "\""));
    if (e.id.empty() || e.id.size() > 128 ||
        !std::all_of(e.id.begin(), e.id.end(), [](char c) { return c > 0x20 && c < 0x7f; })) {
      return Bad(where, "must be a link_id: 1 to 128 printable bytes without spaces");
    }
    const toml::table* t = value.as_table();
    if (t == nullptr) {
      return Bad(where, "must be a table: { bytes_per_second = 5.5e10, numa_node = 0 }");
    }
    bool have_bandwidth = false;
    for (auto&& [field, v] : *t) {
      const std::string name(field.str());
      if (name == "bytes_per_second" && (v.is_floating_point() || v.is_integer())) {
        e.bytes_per_second = *v.value<double>();
        if (!(e.bytes_per_second > 0 && e.bytes_per_second <= kMaxLinkBytesPerSecond)) {
          return Bad(where, absl::StrCat("bytes_per_second = ", e.bytes_per_second,
                                         " must be in (0, ", kMaxLinkBytesPerSecond, "]"));
        }
        have_bandwidth = true;
      } else if (name == "numa_node" && v.is_integer()) {
        const int64_t n = *v.value<int64_t>();
        if (n < 0 || n >= 1024) {
          return Bad(where, absl::StrCat("numa_node = ", n, " must be in [0, 1023]"));
        }
        e.numa_node = static_cast<uint32_t>(n);
      } else {
        return Bad(where, absl::StrCat(name,
                                       " is not a known field or has the wrong type "
                                       "(bytes_per_second: a number, numa_node: an integer)"));
      }
    }
    if (!have_bandwidth) return Bad(where, "needs bytes_per_second");
    out->push_back(std::move(e));
  }
  return absl::OkStatus();
}

std::map<std::string, Setter> Schema(DaemonConfig* c) {
  std::map<std::string, Setter> s;
  s["server.socket"] = String(&c->server.socket_path);
  s["server.tcp"] = String(&c->server.tcp_address);
  s["server.metrics"] = String(&c->server.metrics_address);
  s["server.log_level"] = [c](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    if (!v) return Bad(where, "must be a string");
    auto level = ParseLogLevel(*v);
    if (!level.ok()) return Bad(where, absl::StrCat("= \"", *v, "\": ", level.status().message()));
    c->server.log_level = *level;
    return absl::OkStatus();
  };
  s["server.reap_interval_ms"] = Millis(&c->server.reap_interval, 10);
  s["server.policy_threads"] =
      Integer([c](int64_t v) { c->server.policy_threads = static_cast<int>(v); }, 0, 64);
  s["server.unread_timeout_ms"] =
      Integer([c](int64_t v) { c->server.unread_timeout = absl::Milliseconds(v); }, 0, 600'000);
  s["server.heartbeat_priority"] =
      Integer([c](int64_t v) { c->server.heartbeat_priority = static_cast<int>(v); }, 0, 99);
  s["server.snapshot_priority"] =
      Integer([c](int64_t v) { c->server.snapshot_priority = static_cast<int>(v); }, 0, 99);
  s["server.channel_connections"] =
      Integer([c](int64_t v) { c->server.channel_connections = static_cast<int>(v); }, 1, 65536);
  s["server.channel_connections_per_uid"] = Integer(
      [c](int64_t v) { c->server.channel_connections_per_uid = static_cast<int>(v); }, 1, 65536);
  s["server.channel_request_timeout_ms"] = Integer(
      [c](int64_t v) { c->server.channel_request_timeout = absl::Milliseconds(v); }, 10, 60'000);
  s["server.max_connections"] =
      Integer([c](int64_t v) { c->server.max_connections = static_cast<int>(v); }, 1, 1'000'000);
  s["server.max_connections_per_uid"] = Integer(
      [c](int64_t v) { c->server.max_connections_per_uid = static_cast<int>(v); }, 1, 1'000'000);
  s["server.max_tcp_connections"] = Integer(
      [c](int64_t v) { c->server.max_tcp_connections = static_cast<int>(v); }, 0, 1'000'000);
  s["server.max_concurrent_streams"] = Integer(
      [c](int64_t v) { c->server.max_concurrent_streams = static_cast<int>(v); }, 1, 10'000);
  s["server.grpc_memory_mib"] =
      Integer([c](int64_t v) { c->server.grpc_memory_mib = static_cast<int>(v); }, 16, 1 << 20);
  s["server.idle_timeout_ms"] =
      Integer([c](int64_t v) { c->server.idle_timeout = absl::Milliseconds(v); }, 0, 86'400'000);
  s["pools.ddr_mib"] = Mebibytes(&c->core.ddr_pool_bytes, 1);
  s["pools.compressed_mib"] = Mebibytes(&c->core.compressed_pool_bytes, 1);
  s["pools.shm_prefix"] = [c](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    if (!v || v->size() < 2 || (*v)[0] != '/' || v->find('/', 1) != std::string::npos) {
      return Bad(where, "must be a string like \"/kvtier\": one leading slash, no other");
    }
    c->core.shm_prefix = *v;
    return absl::OkStatus();
  };
  s["pools.group"] = String(&c->core.shm_group);
  s["pools.mode"] = [c](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    char* end = nullptr;
    unsigned long mode = v ? std::strtoul(v->c_str(), &end, 8) : 0;
    if (!v || v->empty() || *end != '\0' || mode > 0777) {
      return Bad(where, "must be an octal string such as \"0660\"");
    }
    if ((mode & 0007) != 0) {
      return Bad(where, absl::StrCat("= \"", *v,
                                     "\" gives other users access: the socket and "
                                     "pools must not be world-accessible (use 0660 or 0600)"));
    }
    c->core.shm_mode = static_cast<uint32_t>(mode);
    return absl::OkStatus();
  };
  s["pools.extent_mib"] = Mebibytes(&c->core.extent_bytes, 1);
  s["pools.extent_dir"] = String(&c->core.extent_dir);
  s["pools.backend"] = [c](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    if (!v || !IsPoolBackend(*v)) {
      return Bad(where, absl::StrCat("= ", v ? absl::StrCat("\"", *v, "\" ") : std::string(),
                                     kPoolBackendChoices));
    }
    c->core.pool_backend = *v;
    return absl::OkStatus();
  };
  s["pools.cuda_library"] = [c](const toml::node& n, const std::string& where) -> absl::Status {
    auto v = n.value<std::string>();
    if (!v || !n.is_string() || v->empty()) {
      return Bad(where, absl::StrCat(v ? absl::StrCat("= \"", *v, "\" ") : std::string(),
                                     "must be a library name or path such as \"libcuda.so.1\""));
    }
    c->core.cuda_library = *v;
    return absl::OkStatus();
  };
  s["pools.numa_node"] =
      Integer([c](int64_t v) { c->core.numa_node = static_cast<int>(v); }, -1, 4095);
  s["leases.ttl_ms"] = Millis(&c->core.lease_ttl, 100);
  s["leases.heartbeat_ms"] = Millis(&c->core.heartbeat_interval, 10);
  s["schedules.assumed_step_ms"] = Millis(&c->core.assumed_step, 1);
  s["limits.max_workers"] =
      Integer([c](int64_t v) { c->core.max_workers = static_cast<uint32_t>(v); }, 1, 1 << 16);
  s["limits.max_sequences_per_worker"] = Integer(
      [c](int64_t v) { c->core.max_sequences_per_worker = static_cast<uint32_t>(v); }, 1, 1 << 20);
  s["limits.max_sequences"] =
      Integer([c](int64_t v) { c->core.max_sequences = static_cast<uint32_t>(v); }, 1, 1 << 24);
  s["limits.max_worker_entries"] =
      Integer([c](int64_t v) { c->core.max_worker_entries = static_cast<uint64_t>(v); }, 1,
              int64_t{1} << 40);
  s["limits.max_node_entries"] = Integer(
      [c](int64_t v) { c->core.max_node_entries = static_cast<uint64_t>(v); }, 1, int64_t{1} << 40);
  s["limits.max_snapshot_entries"] =
      Integer([c](int64_t v) { c->core.max_snapshot_entries = static_cast<uint64_t>(v); }, 1,
              int64_t{1} << 24);
  s["security.allow_uids"] = Ids(&c->core.security.allow_uids);
  s["security.allow_gids"] = Ids(&c->core.security.allow_gids);
  s["security.operator_uids"] = Ids(&c->core.security.operator_uids);
  s["blocks.mib"] = Mebibytes(&c->core.blocks.budget_bytes, 0);
  s["blocks.space_mib"] = Mebibytes(&c->core.blocks.space_bytes, 1);
  s["blocks.shared_uids"] = Ids(&c->core.blocks.shared_uids);
  s["limits.worker_ddr_quota_mib"] = Mebibytes(&c->core.worker_ddr_quota_bytes, 0);
  s["limits.worker_compressed_quota_mib"] = Mebibytes(&c->core.worker_compressed_quota_bytes, 0);
  s["policy.name"] = String(&c->policy.name);
  s["policy.hbm_ratio"] = Ratio(&c->policy.hbm_ratio);
  s["policy.evict_ratio"] = Ratio(&c->policy.evict_ratio);
  s["policy.compress_ratio"] = Ratio(&c->policy.compress_ratio);
  s["policy.max_lost_mass"] = Ratio(&c->policy.max_lost_mass);
  return s;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (name == LogLevelName(l)) return l;
  }
  return absl::InvalidArgumentError("log level must be one of debug, info, warning, error");
}

absl::StatusOr<DaemonConfig> ParseConfig(std::string_view text, std::string_view source_view) {
  // Debian's Abseil has its own string_view: keep names as std::string for StrCat.
  const std::string source(source_view);
  // Debian's libtomlplusplus is built with exceptions: catch them at this edge.
  toml::table root;
  try {
    root = toml::parse(text, source_view);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", static_cast<uint64_t>(e.source().begin.line), ":",
        static_cast<uint64_t>(e.source().begin.column), ": ", std::string(e.description())));
  }
  DaemonConfig config;
  std::map<std::string, Setter> schema = Schema(&config);
  for (auto&& [section_key, section] : root) {
    std::string section_name(section_key.str());
    const toml::table* table = section.as_table();
    if (table == nullptr) {
      return Bad(Where(source, section, section_name),
                 "is not a known section (expected [server], [pools], [leases], [limits], "
                 "[security], [blocks], [schedules], [links] or [policy])");
    }
    if (section_name == "links") {
      RETURN_IF_ERROR(ParseLinks(source, *table, &config.core.links));
      continue;
    }
    for (auto&& [key, value] : *table) {
      std::string full = absl::StrCat(section_name, ".", std::string(key.str()));
      auto it = schema.find(full);
      if (it == schema.end()) return Bad(Where(source, value, full), "is not a known key");
      RETURN_IF_ERROR(it->second(value, Where(source, value, full)));
    }
  }
  if (config.policy.evict_ratio + config.policy.compress_ratio > 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": policy.evict_ratio + policy.compress_ratio = ",
                     config.policy.evict_ratio + config.policy.compress_ratio, " exceeds 1"));
  }
  if (config.core.lease_ttl <= config.core.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": leases.ttl_ms ", absl::ToInt64Milliseconds(config.core.lease_ttl),
                     " must exceed leases.heartbeat_ms ",
                     absl::ToInt64Milliseconds(config.core.heartbeat_interval),
                     " (a worker would lose its lease between two heartbeats)"));
  }
  if (config.server.socket_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": server.socket must not be empty"));
  }
  return config;
}

std::string ResolveMetricsAddress(const std::string& metrics, const std::string& socket_path) {
  if (metrics != kMetricsAuto) return metrics;
  return socket_path == edge::kDefaultSocketPath ? kHostMetricsAddress : "";
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

}  // namespace kvtier::daemon
