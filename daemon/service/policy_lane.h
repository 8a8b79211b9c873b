#ifndef KVTIER_DAEMON_SERVICE_POLICY_LANE_H_
#define KVTIER_DAEMON_SERVICE_POLICY_LANE_H_

// The threads that run snapshots (policy decisions and plans) for the gRPC service, so that the
// few threads gRPC runs callbacks on (two on a 2-core host, which also poll the sockets) stay
// free for heartbeats, acks and status: a snapshot queues behind other snapshots, never a
// heartbeat behind a snapshot. (A lower scheduling priority for the lane was measured too: it
// lengthened snapshots on a busy host and gained the heartbeats nothing; docs/benchmarks.md.)

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::daemon {

// Thread-safe. One owner: the constructor starts the threads, the destructor runs what is
// queued, then stops and joins them.
class PolicyLane {
 public:
  explicit PolicyLane(int threads);
  ~PolicyLane();
  PolicyLane(const PolicyLane&) = delete;
  PolicyLane& operator=(const PolicyLane&) = delete;

  // Runs `task` on a lane thread, in arrival order with the other tasks.
  void Schedule(std::function<void()> task);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SERVICE_POLICY_LANE_H_
