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
// priority cannot be turned into a busy core by a client that floods it, and the lane gives the
// priority up while all connections together send more than kMaxLaneBeatsPerSecond.
//
// A connection is kept once the core accepted a heartbeat on it, and dropped when its peer closes
// it, sends anything but a heartbeat, sends too fast, leaves an answer unread (its queue is
// full), or has a heartbeat refused (a lost lease, another daemon's epoch, a session it may not
// speak for): the worker connects anew after registering again.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/daemon_core.h"
#include "daemon/metrics.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// Lane-wide, the real-time priority is lent to heartbeats while they stay under
// `max_per_second` together: many connections, each within its own rate, could otherwise keep a
// core busy at that priority. Past the cap the lane gives the priority up until a whole window
// passes under it. Not thread-safe (the lane's thread owns it).
class PriorityValve {
 public:
  explicit PriorityValve(int max_per_second, absl::Duration window = absl::Milliseconds(100))
      : max_per_window_(std::max<int64_t>(1, max_per_second * absl::ToDoubleSeconds(window))),
        window_(window) {}

  // Counts one heartbeat answered at `now`; true while the lane may keep its priority.
  bool Count(absl::Time now);

 private:
  const int64_t max_per_window_;
  const absl::Duration window_;
  absl::Time window_start_ = absl::InfinitePast();
  int64_t count_ = 0;
  bool allowed_ = true;
};

struct HeartbeatLaneOptions {
  int max_connections = 1024;  // kept connections; past it a worker heartbeats over gRPC
  int realtime_priority = 0;   // SCHED_FIFO priority of the lane's thread; 0 = the default policy
  Metrics* metrics = nullptr;  // drops, kept connections, priority (may be null; must outlive)
};

// One owner: the constructor starts the thread, the destructor closes every connection and
// joins it. Thread-safe.
class HeartbeatLane {
 public:
  using LogFn = std::function<void(const std::string&)>;
  static constexpr int kMaxBeatsPerSecond = 1000;  // per connection
  static constexpr int kBurst = 32;
  // All connections together, for the real-time priority (PriorityValve): some 10% of a core.
  static constexpr int kMaxLaneBeatsPerSecond = 5000;

  // `core` must outlive this. `log_info` hears of the thread's priority and of each connection
  // kept, `log_warning` of each one dropped for what its peer did.
  HeartbeatLane(DaemonCore* core, HeartbeatLaneOptions options, LogFn log_info, LogFn log_warning);
  ~HeartbeatLane();
  HeartbeatLane(const HeartbeatLane&) = delete;
  HeartbeatLane& operator=(const HeartbeatLane&) = delete;

  // Answers `first` on `connection` and keeps the connection for the peer's later heartbeats.
  // A heartbeat the core refuses is answered and the connection closed; so is one past
  // max_connections (RESOURCE_EXHAUSTED: the worker heartbeats over gRPC).
  void Adopt(edge::UniqueFd connection, const edge::PeerCredentials& peer,
             const v1::HeartbeatRequest& first);

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
  void CountDrop(Metrics::ConnectionDrop reason);
  // Sets the kept-connections gauge; needs mu_ for the count.
  void GaugeConnectionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up or takes back the real-time priority as the valve says.
  void Throttle(absl::Time now);
  // Notes (and gauges) whether the thread runs at the real-time priority now.
  void SetRealtime(bool realtime);

  DaemonCore* const core_;
  const HeartbeatLaneOptions options_;
  const LogFn log_info_, log_warning_;
  edge::UniqueFd epoll_, wake_read_, wake_write_;
  absl::Mutex mu_;
  // Keyed by descriptor. Adopt inserts; only the lane's thread erases, so the thread may use an
  // entry without the lock while it serves it.
  absl::flat_hash_map<int, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  // The lane's thread's own.
  PriorityValve valve_{kMaxLaneBeatsPerSecond};
  bool granted_ = false;   // the system let the thread take options_.realtime_priority
  bool realtime_ = false;  // the thread runs at that priority now
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_HEARTBEAT_LANE_H_
