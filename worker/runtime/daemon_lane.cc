#include "worker/runtime/daemon_lane.h"

#include <utility>

#include "kvtier/client.h"

namespace kvtier::worker {

DaemonLane::DaemonLane(WorkerClient* client) : client_(client) {
  thread_ = std::thread([this] { Loop(); });
}

DaemonLane::~DaemonLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DaemonLane::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> call = std::move(queue_.front());
    queue_.pop_front();
    running_call_ = true;
    lock.unlock();
    call();
    lock.lock();
    running_call_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void DaemonLane::Enqueue(std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(call));
  }
  cv_.notify_one();
}

bool DaemonLane::Submit(v1::SubmitSnapshotRequest snapshot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_) return false;
    in_flight_ = true;
    answer_.reset();
  }
  Enqueue([this, snapshot = std::move(snapshot)]() mutable {
    absl::StatusOr<v1::TierPlan> plan = client_->SubmitSnapshot(std::move(snapshot));
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = std::move(plan);
  });
  return true;
}

std::optional<absl::StatusOr<v1::TierPlan>> DaemonLane::TakePlan() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!answer_.has_value()) return std::nullopt;
  std::optional<absl::StatusOr<v1::TierPlan>> out = std::move(answer_);
  answer_.reset();
  in_flight_ = false;
  return out;
}

bool DaemonLane::snapshot_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void DaemonLane::Ack(uint64_t sequence_id, uint64_t plan_version, bool applied, std::string error) {
  Enqueue([this, sequence_id, plan_version, applied, error = std::move(error)] {
    absl::Status s = client_->AckPlan(sequence_id, plan_version, applied, error);
    std::lock_guard<std::mutex> lock(mu_);
    acks_ok_ = s.ok();
  });
}

bool DaemonLane::acks_confirmed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return acks_ok_ && queue_.empty() && !running_call_;
}

void DaemonLane::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !running_call_; });
}

}  // namespace kvtier::worker
