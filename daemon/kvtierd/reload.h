#ifndef KVTIER_DAEMON_KVTIERD_RELOAD_H_
#define KVTIER_DAEMON_KVTIERD_RELOAD_H_

// What a SIGHUP may change. kvtierd re-reads its config file on SIGHUP; this decides, setting by
// setting, what it applies at once and what only a restart changes, so the log names both.

#include <string>
#include <vector>

#include "daemon/config/config.h"

namespace kvtier::daemon {

// The differences between the running config and a freshly read one. Each entry reads
// "section.key old -> new" (e.g. "limits.max_workers 1 -> 2", "pools.ddr_mib 64 -> 128").
struct ConfigChanges {
  std::vector<std::string> applied;        // server.log_level, [limits], [leases], [security]
  std::vector<std::string> needs_restart;  // [server] listeners, [pools], [policy]
};

// Compares two configs. Pure; thread-compatible.
ConfigChanges DiffConfigs(const DaemonConfig& running, const DaemonConfig& fresh);

// `running` with the settings a SIGHUP applies taken from `fresh`; the restart-only settings
// keep their running values (so the next SIGHUP reports them again while they differ).
DaemonConfig ApplyReloadable(const DaemonConfig& running, const DaemonConfig& fresh);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_RELOAD_H_
