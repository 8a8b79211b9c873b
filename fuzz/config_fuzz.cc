// libFuzzer target for kvtierd's config parser (daemon/config): any bytes are either a config
// with every setting in range or an INVALID_ARGUMENT that names where; never a crash.
//
// Built with -DKVTIER_FUZZ=ON (clang), and in the normal build as config_fuzz_replay.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/kvtierd/reload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::daemon;  // NOLINT
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<DaemonConfig> c = ParseConfig(text, "fuzz.toml");
  if (!c.ok()) {
    // Errors name their source, and are invalid input, nothing else.
    if (c.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (c.status().message().find("fuzz.toml") == std::string_view::npos) std::abort();
    return 0;
  }
  const kvtier::daemon::CoreOptions& o = c->core;
  if (o.lease_ttl <= o.heartbeat_interval) std::abort();
  if ((o.shm_mode & 0007) != 0) std::abort();
  if (o.max_snapshot_entries == 0 || o.ddr_pool_bytes == 0 || o.compressed_pool_bytes == 0) {
    std::abort();
  }
  if (c->policy.evict_ratio + c->policy.compress_ratio > 1.0) std::abort();
  // A config never differs from itself, and a reload onto itself changes nothing.
  ConfigChanges same = DiffConfigs(*c, *c);
  if (!same.applied.empty() || !same.needs_restart.empty()) std::abort();
  ConfigChanges again = DiffConfigs(ApplyReloadable(*c, *c), *c);
  if (!again.applied.empty()) std::abort();
  return 0;
}
