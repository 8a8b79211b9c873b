#include "engine/thread_pool.h"

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
constexpr size_t kChunksPerThread = 4;
constexpr uint64_t kTicketClosed = 0xFFFFFFFF;  // chunk index no call reaches
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint32_t gen) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  while (true) {
    if ((t >> 32) != gen || (t & 0xFFFFFFFF) >= num_chunks_.load(std::memory_order_relaxed)) {
      return;
    }
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
    const size_t c = t & 0xFFFFFFFF;
    const size_t begin = c * chunk_, end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
    done_.fetch_add(1, std::memory_order_acq_rel);
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn,
                             size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  // Close the previous call's ticket before touching this call's parameters: a worker that
  // still holds a stale ticket from it must fail its claim rather than run one of this call's
  // chunks (done_ would then overshoot num_chunks and this call would never return).
  ticket_.store(ticket_.load(std::memory_order_relaxed) | kTicketClosed, std::memory_order_release);
  const size_t parts = num_threads() * kChunksPerThread;
  const size_t units = (n + grain - 1) / grain;
  chunk_ = (units + parts - 1) / parts * grain;
  const size_t num_chunks = (n + chunk_ - 1) / chunk_;
  num_chunks_.store(num_chunks, std::memory_order_relaxed);
  fn_ = &fn;
  n_ = n;
  done_.store(0, std::memory_order_relaxed);
  uint32_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = generation_.load(std::memory_order_relaxed) + 1;
    ticket_.store(uint64_t{gen} << 32, std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
  }
  cv_.notify_all();
  RunChunks(gen);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != num_chunks) {
    if (++spins < kSpinIterations) {
      KVTIER_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::Run(uint32_t n, const std::function<void(uint32_t)>& task) {
  ParallelFor(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) task(static_cast<uint32_t>(i));
  });
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  while (true) {
    bool ready = false;
    for (int i = 0; i < kSpinIterations && !ready; ++i) {
      ready = generation_.load(std::memory_order_acquire) != seen;
      if (!ready) KVTIER_CPU_RELAX();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
    }
    seen = generation_.load(std::memory_order_acquire);
    RunChunks(seen);
  }
}

}  // namespace kvtier::engine
