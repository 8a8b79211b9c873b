#ifndef KVTIER_EDGE_HEALTH_PROBE_H_
#define KVTIER_EDGE_HEALTH_PROBE_H_

// Is kvtierd serving its workers? Asked the way a worker would ask, through the daemon's own
// sockets: a hello on the memory channel, a heartbeat through the channel's heartbeat path, and a
// gRPC call on a connection of its own. A status answered from inside the daemon proves only that
// its core is not wedged; a wedged channel (its threads blocked), a deaf gRPC listener (accepting
// nothing after EMFILE) or a path that leads to something else leave the core answering while
// every worker is cut off. `kvtierctl health` (the k8s probes) and kvtierd's systemd watchdog
// both run this probe, so they see what workers see. docs/reliability.md, "Health".

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvtier::edge {

// The checks, in the order they run. Their names are what a failing probe reports.
inline constexpr char kCheckHello[] = "channel-hello";
inline constexpr char kCheckHeartbeat[] = "channel-heartbeat";
inline constexpr char kCheckGrpc[] = "grpc-status";

struct HealthCheck {
  std::string name;  // one of kCheck*
  // OK when the daemon answered in time, whatever it answered (a refusal is an answer: the
  // daemon read the request and replied); UNAVAILABLE when nothing serves the path,
  // DEADLINE_EXCEEDED when nothing answered in time.
  absl::Status status;
  absl::Duration latency;
  std::string detail;  // what the answer said, for the operator
};

struct HealthReport {
  std::vector<HealthCheck> checks;
  bool ok() const;
  // The names of the checks that failed, comma-separated ("" when none did).
  std::string FailedChecks() const;
};

struct HealthProbeOptions {
  std::string socket_path;  // kvtierd's gRPC unix socket; the channel is ChannelPathFor() it
  // Each check's own deadline: a probe takes at most about three of them.
  absl::Duration timeout = absl::Seconds(2);
};

// Runs every check, each on a connection of its own (so a deaf listener is seen: an open
// connection would still be served). Thread-safe; blocks at most about 3 × options.timeout.
//  - channel-hello: a ChannelHello on the memory channel, as a worker says before registering.
//  - channel-heartbeat: a heartbeat on a connection that opens with one, as a worker's kept
//    heartbeat connection does, for worker 0, which no daemon issues: the daemon refuses it
//    (FAILED_PRECONDITION) in the core call that renews a real lease, under the same lock,
//    without counting it as anyone's error. That proves the channel answers heartbeats without
//    registering anything.
//  - grpc-status: GetStatus (node totals) over gRPC, on a new connection.
HealthReport ProbeHealth(const HealthProbeOptions& options);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_HEALTH_PROBE_H_
