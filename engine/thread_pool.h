#ifndef KVTIER_ENGINE_THREAD_POOL_H_
#define KVTIER_ENGINE_THREAD_POOL_H_

// A tiny fork-join pool for splitting matrix rows across cores. The calling thread takes part,
// so a pool of N threads starts N-1 workers. Work is cut into a few chunks per thread that
// threads claim from a shared counter, so a worker the OS has not scheduled yet delays
// nothing: the others take its chunks (this matters on a busy 2-core host). Workers spin
// briefly before sleeping because the forward pass forks ~200 times per token.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/kernels/task_runner.h"

namespace kvtier::engine {

// Thread-compatible: ParallelFor must not be called concurrently or re-entrantly. The owner
// starts the workers in the constructor and joins them in the destructor.
// As a kernels::TaskRunner it lends the same threads to the attention kernel.
class ThreadPool final : public worker::kernels::TaskRunner {
 public:
  // `num_threads` >= 1 (values < 1 are treated as 1).
  explicit ThreadPool(int num_threads);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // kernels::TaskRunner: ParallelFor over n tasks of grain 1.
  int concurrency() const override { return num_threads(); }
  void Run(uint32_t n, const std::function<void(uint32_t)>& task) override;

  // Calls fn(begin, end) on disjoint contiguous ranges covering [0, n) and returns when all are
  // done. Range boundaries are multiples of `grain` (except n). Which thread runs which range
  // is unspecified.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

 private:
  void WorkerLoop();
  // Claims and runs chunks of generation `gen` until none is left.
  void RunChunks(uint32_t gen);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::atomic<uint32_t> generation_{0};
  // (generation << 32) | next unclaimed chunk: a worker that wakes late cannot claim chunks of
  // a later task by mistake.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<size_t> done_{0};
  // The current task; written before ticket_ publishes it, stable while any chunk is claimed
  // and unfinished.
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t chunk_ = 1;
  // Read before claiming (by workers that may hold a stale ticket), hence atomic.
  std::atomic<size_t> num_chunks_{0};
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_THREAD_POOL_H_
