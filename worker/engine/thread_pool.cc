#include "worker/engine/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define KVTIER_CPU_RELAX() _mm_pause()
#else
#define KVTIER_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvtier::engine {
namespace {
constexpr int kSpinIterations = 2000;  // a few microseconds before yielding or sleeping
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunk(int index) {
  size_t parts = workers_.size() + 1;
  size_t units = (n_ + grain_ - 1) / grain_;
  size_t begin = std::min(n_, units * index / parts * grain_);
  size_t end = std::min(n_, units * (index + 1) / parts * grain_);
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn,
                             size_t grain) {
  if (n == 0) return;
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = std::max<size_t>(1, grain);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  RunChunk(0);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      KVTIER_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    bool ready = false;
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen) {
        ready = true;
        break;
      }
      KVTIER_CPU_RELAX();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    RunChunk(index);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace kvtier::engine
