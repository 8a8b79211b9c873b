#ifndef KVTIER_CLIENT_LIB_HEARTBEAT_CHANNEL_H_
#define KVTIER_CLIENT_LIB_HEARTBEAT_CHANNEL_H_

// A worker's heartbeats over a connection of the memory channel that it keeps open: kvtierd
// answers them on a thread of their own (daemon/kvtierd/heartbeat_lane.h), so a lease renewal
// does not queue behind the snapshots of every worker on the host, as it does over gRPC.

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::internal {

// Thread-safe: one heartbeat at a time on the connection.
class HeartbeatChannel {
 public:
  // `timeout` bounds the connect, the send and the wait for the answer.
  HeartbeatChannel(std::string channel_path, absl::Duration timeout)
      : channel_path_(std::move(channel_path)), timeout_(timeout) {}

  // One heartbeat. The daemon's answer: OK with `response` filled, or the status it gave.
  // UNAVAILABLE or DEADLINE_EXCEEDED when it could not be reached in time (the connection is
  // made again next time). nullopt when the daemon does not take heartbeats on the channel (one
  // that predates them, or one that keeps as many connections as it will): send it over gRPC.
  std::optional<absl::Status> Beat(const v1::HeartbeatRequest& request,
                                   v1::HeartbeatResponse* response);

  // Tries the channel again after a daemon declined it (a new session may be a new daemon).
  void Retry();

 private:
  const std::string channel_path_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  edge::UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  bool declined_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvtier::internal

#endif  // KVTIER_CLIENT_LIB_HEARTBEAT_CHANNEL_H_
