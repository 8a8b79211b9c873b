#ifndef KVTIER_WORKER_ENGINE_THREAD_POOL_H_
#define KVTIER_WORKER_ENGINE_THREAD_POOL_H_

// A tiny fork-join pool for splitting matrix rows across cores. The calling thread takes part,
// so a pool of N threads starts N-1 workers. Workers spin briefly before sleeping because the
// forward pass forks ~200 times per token and a condition-variable wake-up alone costs ~10 µs.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::engine {

// Thread-compatible: ParallelFor must not be called concurrently or re-entrantly. The owner
// starts the workers in the constructor and joins them in the destructor.
class ThreadPool {
 public:
  // `num_threads` >= 1 (values < 1 are treated as 1).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint contiguous ranges covering [0, n), one per thread, and
  // returns when all are done. Ranges are aligned to `grain` items (except the last).
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

 private:
  void WorkerLoop(int index);
  void RunChunk(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};  // written under mu_
  std::atomic<int> pending_{0};
  bool stop_ = false;  // guarded by mu_
  // Current task; published before generation_ is bumped.
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
};

}  // namespace kvtier::engine

#endif  // KVTIER_WORKER_ENGINE_THREAD_POOL_H_
