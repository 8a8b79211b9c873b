#ifndef KVTIER_WORKER_RUNTIME_DAEMON_LANE_H_
#define KVTIER_WORKER_RUNTIME_DAEMON_LANE_H_

// One sequence's calls to kvtierd, off the token path (DESIGN.md §6: the token path never waits
// on the daemon). A background thread runs the calls in the order they were queued; the decode
// loop queues a snapshot and picks its plan up at a later step boundary, and acknowledgements go
// out behind it. A slow, stalled or restarting daemon delays tiering, never a token.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {
class WorkerClient;
}  // namespace kvtier

namespace kvtier::worker {

// Thread-safe. One owner starts the thread (constructor) and stops it (destructor, which lets
// the queued calls finish: each is bounded by the client's RPC deadline).
class DaemonLane {
 public:
  // `client` must outlive the lane.
  explicit DaemonLane(WorkerClient* client);
  ~DaemonLane();
  DaemonLane(const DaemonLane&) = delete;
  DaemonLane& operator=(const DaemonLane&) = delete;

  // Queues a snapshot. False (nothing queued) while the previous one's plan was not taken.
  bool Submit(v1::SubmitSnapshotRequest snapshot);
  // The answer to the snapshot in flight once it came (a plan or the call's error); nullopt
  // while it is still on its way or none is in flight.
  std::optional<absl::StatusOr<v1::TierPlan>> TakePlan();
  // True from Submit until TakePlan returned the answer.
  bool snapshot_in_flight() const;
  // Queues an acknowledgement (behind any queued snapshot: the lane keeps the order).
  void Ack(uint64_t sequence_id, uint64_t plan_version, bool applied, std::string error);
  // Whether every ack queued so far arrived (false after one failed, until one succeeds).
  bool acks_confirmed() const;
  // Blocks until every queued call ran (tests, and before the sequence re-opens elsewhere).
  void Drain();

 private:
  void Loop();
  void Enqueue(std::function<void()> call);

  WorkerClient* const client_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_call_ = false;
  bool stop_ = false;
  bool in_flight_ = false;
  std::optional<absl::StatusOr<v1::TierPlan>> answer_;
  bool acks_ok_ = true;
  std::thread thread_;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_DAEMON_LANE_H_
