#ifndef KVTIER_DAEMON_KVTIERD_HEARTBEAT_LANE_H_
#define KVTIER_DAEMON_KVTIERD_HEARTBEAT_LANE_H_

// Heartbeats on kept connections of the memory channel, answered by one thread of their own.
//
// Over gRPC a heartbeat waits for the same two callback threads that read every snapshot, and
// under a flood of 32 workers its p99 was 3–5 ms (docs/reliability.md). Here a worker's
// heartbeats come on a SOCK_SEQPACKET connection it keeps, and this thread answers them with one
// short call into the core: nothing queues them behind a snapshot. Optionally the thread runs at
// a real-time priority (SCHED_FIFO), so the host's scheduler does not queue it behind the
// workers either; a connection may send at most kMaxBeatsPerSecond (a burst of kBurst), so that
// priority cannot be turned into a busy core by a client that floods it.
//
// A connection is dropped when its peer closes it, sends anything but a heartbeat, sends too
// fast, leaves an answer unread (its queue is full), or speaks for a worker of another uid.

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/daemon_core.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

struct HeartbeatLaneOptions {
  int max_connections = 1024;  // kept connections; past it a worker heartbeats over gRPC
  int realtime_priority = 0;   // SCHED_FIFO priority of the lane's thread; 0 = the default policy
};

// One owner: the constructor starts the thread, the destructor closes every connection and
// joins it. Thread-safe.
class HeartbeatLane {
 public:
  using LogFn = std::function<void(const std::string&)>;
  static constexpr int kMaxBeatsPerSecond = 1000;
  static constexpr int kBurst = 32;

  // `core` must outlive this. `log_info` hears of the thread's priority and of each connection
  // kept, `log_warning` of each one dropped for what its peer did.
  HeartbeatLane(DaemonCore* core, HeartbeatLaneOptions options, LogFn log_info, LogFn log_warning);
  ~HeartbeatLane();
  HeartbeatLane(const HeartbeatLane&) = delete;
  HeartbeatLane& operator=(const HeartbeatLane&) = delete;

  // Answers `first` on `connection` and keeps the connection for the peer's later heartbeats.
  // A heartbeat the core refuses is answered and the connection closed; so is one past
  // max_connections (RESOURCE_EXHAUSTED: the worker keeps to gRPC).
  void Adopt(edge::UniqueFd connection, const edge::PeerCredentials& peer,
             const v1::HeartbeatRequest& first);

  int connections() const;

 private:
  struct Connection {
    edge::UniqueFd fd;
    edge::PeerCredentials peer;
    double tokens = kBurst;
    absl::Time refilled;
  };

  void Loop();
  // Reads and answers one request; false when the connection must go.
  bool Serve(Connection& c);
  // Answers one heartbeat; false when the connection must go.
  bool Answer(int fd, const edge::PeerCredentials& peer, const v1::HeartbeatRequest& request);
  void Drop(int fd);

  DaemonCore* const core_;
  const HeartbeatLaneOptions options_;
  const LogFn log_info_, log_warning_;
  edge::UniqueFd epoll_, wake_read_, wake_write_;
  mutable absl::Mutex mu_;
  // Keyed by descriptor. Adopt inserts; only the lane's thread erases, so the thread may use an
  // entry without the lock while it serves it.
  absl::flat_hash_map<int, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_HEARTBEAT_LANE_H_
