#ifndef KVTIER_CLIENT_LIB_KEPT_CHANNEL_H_
#define KVTIER_CLIENT_LIB_KEPT_CHANNEL_H_

// A worker's heartbeats, or its snapshots, over a connection of the memory channel that it keeps
// open: kvtierd answers each kind on a thread of its own (daemon/kvtierd/channel_lane.h), so a
// lease renewal does not queue behind the snapshots of every worker on the host, and a snapshot
// skips gRPC's cost, as they do not over gRPC.

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::internal {

// Thread-safe: one request at a time on each connection, up to `max_connections` at once.
class KeptChannel {
 public:
  // `timeout` bounds the connect, the send and the wait for the answer. Every connection's peer
  // must be one of `daemon` (edge::ConnectChannel).
  KeptChannel(std::string channel_path, absl::Duration timeout, edge::DaemonUids daemon,
              int max_connections = 1)
      : channel_path_(std::move(channel_path)),
        timeout_(timeout),
        daemon_(std::move(daemon)),
        max_connections_(max_connections) {}

  // One request and the daemon's reply, whatever its code (the daemon closes the connection after
  // any request it refused; the next one connects anew). UNAVAILABLE or DEADLINE_EXCEEDED when
  // the daemon could not be reached in time. nullopt once declined, and while every connection is
  // busy with another thread's request (rather than queue behind it, as gRPC would not): send it
  // over gRPC.
  std::optional<absl::StatusOr<v1::ChannelReply>> Exchange(const v1::ChannelRequest& request);

  // The daemon does not take this kind of request on the channel: gRPC until Retry().
  void Decline();
  // Tries the channel again (a new session may be a new daemon).
  void Retry();

 private:
  // Gives a connection back after a request (kept, or closed when `keep` is false).
  void Return(edge::UniqueFd fd, bool keep);

  const std::string channel_path_;
  const absl::Duration timeout_;
  const edge::DaemonUids daemon_;
  const int max_connections_;
  absl::Mutex mu_;
  std::vector<edge::UniqueFd> idle_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // idle and in use
  bool declined_ ABSL_GUARDED_BY(mu_) = false;
};

// One heartbeat on `channel`. The daemon's answer: OK with `response` filled, or the status it
// gave. nullopt when the daemon does not take heartbeats on the channel (one that predates them,
// or one that keeps as many connections as it will), and when the channel gave no answer in time
// or none at all (a lane wedged or gone must not let the lease lapse): send it over gRPC, once.
std::optional<absl::Status> ChannelHeartbeat(KeptChannel& channel,
                                             const v1::HeartbeatRequest& request,
                                             v1::HeartbeatResponse* response);

// One snapshot on `channel` (of a daemon whose hello said it takes them). The daemon's answer:
// OK with `plan` filled, or the status it gave; DEADLINE_EXCEEDED when it did not answer in time.
// nullopt when the channel cannot carry it (too large for one datagram, declined, the daemon
// unreachable there or its lane full, the plan too large for the channel): send the same
// snapshot over gRPC (a resubmission gets the plan in flight).
std::optional<absl::Status> ChannelSnapshot(KeptChannel& channel,
                                            const v1::SubmitSnapshotRequest& snapshot,
                                            v1::TierPlan* plan);

}  // namespace kvtier::internal

#endif  // KVTIER_CLIENT_LIB_KEPT_CHANNEL_H_
