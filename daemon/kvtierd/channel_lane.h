#ifndef KVTIER_DAEMON_KVTIERD_CHANNEL_LANE_H_
#define KVTIER_DAEMON_KVTIERD_CHANNEL_LANE_H_

// Heartbeats, and snapshots, on kept connections of the memory channel: each kind answered by
// one thread of its own (a lane).
//
// Over gRPC a heartbeat waits for the same two callback threads that read every snapshot, and
// under a flood of 32 workers its p99 was 3–5 ms (docs/reliability.md). Here a worker's
// heartbeats come on a SOCK_SEQPACKET connection it keeps, and the heartbeat lane answers them
// with one short call into the core: nothing queues them behind a snapshot. Snapshots come on
// another kept connection to the snapshot lane, which answers each with one call into the core,
// at about half gRPC's CPU per snapshot and without its thread hand-offs. Optionally a lane's
// thread runs at a real-time priority (SCHED_FIFO), so the host's scheduler does not queue it
// behind the workers either. That priority must not become a busy core: a heartbeat connection
// may send at most kMaxBeatsPerSecond (a burst of kBurst), and a lane gives the priority up
// while its work together passes a cap (kMaxLaneBeatsPerSecond heartbeats; snapshots that take
// more than kSnapshotCpuShare of a core).
//
// A connection is kept once the core accepted its first request, and dropped when its peer
// closes it, sends a request of the other kind, sends heartbeats too fast, leaves an answer
// unread (its queue is full), or has a request refused (a lost lease, another daemon's epoch, a
// session it may not speak for, a bad snapshot), or attaches descriptors to a request (they, and
// every connection dropped, close on the descriptor sink's thread, never the lane's): the worker
// connects anew for its next request. A lane never waits on a peer: its connections are
// non-blocking both ways.

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
#include "daemon/kvtierd/descriptor_sink.h"
#include "daemon/metrics.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// Lane-wide, the real-time priority is lent to a lane's work while it stays under
// `max_per_second` together (heartbeats, or microseconds of CPU): many connections, each within
// its own rate, could otherwise keep a core busy at that priority. Past the cap the lane gives
// the priority up until a whole window passes under it. Not thread-safe (the lane's thread owns
// it).
class PriorityValve {
 public:
  explicit PriorityValve(int64_t max_per_second, absl::Duration window = absl::Milliseconds(100))
      : max_per_window_(std::max<int64_t>(1, max_per_second * absl::ToDoubleSeconds(window))),
        window_(window) {}

  // Counts `cost` of work done at `now`; true while the lane may keep its priority.
  bool Count(absl::Time now, int64_t cost = 1);

 private:
  const int64_t max_per_window_;
  const absl::Duration window_;
  absl::Time window_start_ = absl::InfinitePast();
  int64_t count_ = 0;
  bool allowed_ = true;
};

struct ChannelLaneOptions {
  int max_connections = 1024;  // kept connections; past it a worker uses gRPC
  int realtime_priority = 0;   // SCHED_FIFO priority of the lane's thread; 0 = the default policy
  Metrics* metrics = nullptr;  // drops, kept connections, priority (may be null; must outlive)
};

// One owner: the constructor starts the thread, the destructor closes every connection and
// joins it. Thread-safe.
class ChannelLane {
 public:
  using Lane = Metrics::Lane;
  using LogFn = std::function<void(const std::string&)>;
  static constexpr int kMaxBeatsPerSecond = 1000;  // per heartbeat connection
  static constexpr int kBurst = 32;
  // All connections together, for the real-time priority (PriorityValve): some 10% of a core.
  static constexpr int kMaxLaneBeatsPerSecond = 5000;
  // The snapshot lane's CPU, for the real-time priority: half a core.
  static constexpr double kSnapshotCpuShare = 0.5;

  // `core` and `sink` must outlive this. `log_info` hears of the thread's priority and of each
  // connection kept, `log_warning` of each one dropped for what its peer did.
  ChannelLane(Lane lane, DaemonCore* core, DescriptorSink* sink, ChannelLaneOptions options,
              LogFn log_info, LogFn log_warning);
  ~ChannelLane();
  ChannelLane(const ChannelLane&) = delete;
  ChannelLane& operator=(const ChannelLane&) = delete;

  // Answers `first` (a request of this lane's kind) on `connection` and keeps the connection for
  // the peer's later ones. A request the core refuses is answered and the connection closed; so
  // is one past max_connections (heartbeats: RESOURCE_EXHAUSTED; snapshots: UNAVAILABLE; either
  // way the worker turns to gRPC). `connection` must be non-blocking.
  void Adopt(edge::UniqueFd connection, const edge::PeerCredentials& peer,
             const v1::ChannelRequest& first);

 private:
  struct Connection {
    edge::UniqueFd fd;
    edge::PeerCredentials peer;
    double tokens = kBurst;
    absl::Time refilled;
  };

  // Adopt's work; false when `connection` (still the caller's) must go.
  bool Keep(edge::UniqueFd& connection, const edge::PeerCredentials& peer,
            const v1::ChannelRequest& first);
  void Loop();
  // Reads and answers one request; false when the connection must go.
  bool Serve(Connection& c);
  // Answers one request of the lane's kind; false when the connection must go.
  bool Answer(int fd, const edge::PeerCredentials& peer, const v1::ChannelRequest& request);
  // The core's answer to one request, or why not.
  absl::StatusOr<v1::ChannelReply> Ask(const edge::PeerCredentials& peer,
                                       const v1::ChannelRequest& request);
  // False (answered, counted) when a heartbeat connection sends faster than its rate.
  bool WithinRate(Connection& c, absl::Time now);
  void Drop(int fd);
  // What a dropped connection's peer did, counted under the lane's own reason for it.
  enum class PeerFault : int { kUnread, kTooFast, kRefused, kMisuse, kLaneFull, kDescriptors };
  void CountDrop(PeerFault fault);
  // Sets the kept-connections gauge; needs mu_ for the count.
  void GaugeConnectionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up or takes back the real-time priority as the valve says, after `cost` of work.
  void Throttle(absl::Time now, int64_t cost);
  // Notes (and gauges) whether the thread runs at the real-time priority now.
  void SetRealtime(bool realtime);

  const Lane lane_;
  const char* const name_;  // "heartbeat lane" or "snapshot lane", for the log
  DaemonCore* const core_;
  DescriptorSink* const sink_;
  const ChannelLaneOptions options_;
  const LogFn log_info_, log_warning_;
  edge::UniqueFd epoll_, wake_read_, wake_write_;
  absl::Mutex mu_;
  // Keyed by descriptor. Adopt inserts; only the lane's thread erases, so the thread may use an
  // entry without the lock while it serves it.
  absl::flat_hash_map<int, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  // The lane's thread's own.
  PriorityValve valve_;
  bool granted_ = false;   // the system let the thread take options_.realtime_priority
  bool realtime_ = false;  // the thread runs at that priority now
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CHANNEL_LANE_H_
