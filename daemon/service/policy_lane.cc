#include "daemon/service/policy_lane.h"

namespace kvtier::daemon {

PolicyLane::PolicyLane(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

PolicyLane::~PolicyLane() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void PolicyLane::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void PolicyLane::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PolicyLane* lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu_) {
            return lane->stopping_ || !lane->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvtier::daemon
