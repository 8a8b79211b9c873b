#include "bench/chaos/stuck_client.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/support/h2_flood.h"
#include "tests/integration/support/http_get.h"

namespace kvtier::testing {

StuckClientFigures RunStuckClient(const DaemonProcess& daemon, int metrics_port,
                                  absl::Duration timeout) {
  StuckClientFigures f;
  f.rss_before = f.rss_max = ResidentBytes(daemon.pid());
  const double plans = ScrapeMetric(metrics_port, "kvtier_snapshots_total");
  const absl::Time t0 = absl::Now();
  const pid_t client = fork();
  if (client == 0) {
    // An empty GetStatusRequest (node totals, no ticket) is zero bytes on the wire.
    (void)FloodWithoutReading(
        {.socket_path = daemon.socket_path(), .reconnect = false, .pause = absl::Milliseconds(20)});
    for (;;) pause();  // dropped: hold on until killed
  }
  // The guard's line names the peer's pid, so it is this client's drop and no other's.
  const std::string line = absl::StrCat("peer stopped reading: pid ", client, " ");
  while (client > 0 && absl::Now() - t0 < timeout) {
    f.rss_max = std::max(f.rss_max, ResidentBytes(daemon.pid()));
    if (daemon.Log().find(line) != std::string::npos) {
      f.dropped = true;
      f.drop_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (client > 0) {
    kill(client, SIGKILL);
    waitpid(client, nullptr, 0);
  }
  f.plans = ScrapeMetric(metrics_port, "kvtier_snapshots_total") - plans;
  return f;
}

}  // namespace kvtier::testing
