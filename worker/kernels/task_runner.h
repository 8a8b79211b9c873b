#ifndef KVTIER_WORKER_KERNELS_TASK_RUNNER_H_
#define KVTIER_WORKER_KERNELS_TASK_RUNNER_H_

// The threads a CPU kernel may split its work over, as an interface so that kernels include no
// thread-pool header and callers bring their own pool (the engine's ThreadPool implements it).

#include <cstdint>
#include <functional>

namespace kvtier::worker::kernels {

// Runs task(i) for every i in [0, n), possibly on several threads at once, and returns when all
// are done. Thread-compatible: one Run at a time.
class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  // Threads that may run tasks at once (the caller included); >= 1.
  virtual int concurrency() const = 0;
  virtual void Run(uint32_t n, const std::function<void(uint32_t)>& task) = 0;
};

}  // namespace kvtier::worker::kernels

#endif  // KVTIER_WORKER_KERNELS_TASK_RUNNER_H_
