#ifndef KVTIER_BENCH_CHAOS_STUCK_CLIENT_H_
#define KVTIER_BENCH_CHAOS_STUCK_CLIENT_H_

// The "client that stops reading" fault of kvtier-chaos: a child process that sends GetStatus
// requests over raw HTTP/2 (tests/integration/support/h2_flood.h: 64 every 20 ms) and never
// reads a byte back, and what the daemon did about it while the workers tiered on. Call from a
// process that has not touched gRPC (it forks). Not thread-safe.

#include <cstdint>

#include "absl/time/time.h"
#include "tests/integration/support/daemon_process.h"

namespace kvtier::testing {

struct StuckClientFigures {
  bool dropped = false;  // the daemon logged that it dropped the connection
  double drop_ms = 0;    // from the client's start to that line
  double plans = 0;      // snapshots the daemon answered meanwhile (kvtier_snapshots_total)
  uint64_t rss_before = 0, rss_max = 0;  // the daemon's, before and at most meanwhile
};

// Starts the client, waits until the daemon's log says it dropped the connection or `timeout`
// passes, then kills the client. `metrics_port` is the daemon's /metrics.
StuckClientFigures RunStuckClient(const DaemonProcess& daemon, int metrics_port,
                                  absl::Duration timeout);

}  // namespace kvtier::testing

#endif  // KVTIER_BENCH_CHAOS_STUCK_CLIENT_H_
