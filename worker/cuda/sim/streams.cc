#include "worker/cuda/sim/streams.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include "worker/cuda/sim/counters.h"
#include "worker/cuda/sim/device_memory.h"
#include "worker/cuda/sim/kernel.h"

namespace kvtier::cudasim {
namespace {

uint32_t JitterMicros() {
  static const uint32_t us = [] {
    const char* env = std::getenv("KVTIER_CUDA_SIM_JITTER_US");
    return env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 50u;
  }();
  return us;
}

std::atomic<int> sticky{cudaSuccess};
thread_local const char* current_kernel = nullptr;
thread_local cudaError_t last_error = cudaSuccess;

struct Registry {
  std::mutex mu;
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;
  std::set<CUevent_st*> events;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

const std::shared_ptr<CUstream_st>& Legacy() {
  static auto* s = new std::shared_ptr<CUstream_st>(new CUstream_st(true, true));
  return *s;
}

}  // namespace

cudaError_t Sticky() { return static_cast<cudaError_t>(sticky.load()); }

void Fault(const char* kernel, const char* what, const void* p, uint64_t bytes) {
  std::fprintf(stderr,
               "kvtier CUDA simulation: illegal address in %s: %s [%p, +%llu) is not device "
               "memory, pinned or registered host memory\n",
               kernel != nullptr ? kernel : "a copy", what, p,
               static_cast<unsigned long long>(bytes));
  int expected = cudaSuccess;
  sticky.compare_exchange_strong(expected, cudaErrorIllegalAddress);
}

cudaError_t Fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

cudaError_t TakeLastError() {
  const cudaError_t e = last_error;
  last_error = Sticky() != cudaSuccess ? Sticky() : cudaSuccess;
  return e != cudaSuccess ? e : Sticky();
}
cudaError_t PeekLastError() { return last_error != cudaSuccess ? last_error : Sticky(); }

bool Touch(const void* p, uint64_t bytes, const char* what) {
  if (DeviceAccessible(p, bytes)) return true;
  Fault(current_kernel, what, p, bytes);
  return false;
}

bool EnqueueKernel(cudaStream_t stream, const char* name, std::function<void()> body) {
  Count(Counter::kRuntimeCall);
  Count(Counter::kKernelLaunch);
  std::shared_ptr<CUstream_st> s = Resolve(stream);
  if (s == nullptr) return false;
  Submit(*s, Op{std::move(body), name, false});
  return true;
}

cudaError_t Launch(cudaStream_t stream, const char* name, std::function<void()> body) {
  if (!EnqueueKernel(stream, name, std::move(body))) Fail(cudaErrorInvalidResourceHandle);
  return TakeLastError();
}

std::shared_ptr<CUstream_st> Resolve(cudaStream_t s) {
  if (s == nullptr) return Legacy();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(s);
  return it != r.streams.end() ? it->second : nullptr;
}

void Submit(CUstream_st& s, Op op) {
  // The legacy stream waits for the blocking streams' earlier work and they for its.
  std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> before;
  if (s.legacy) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [raw, other] : r.streams) {
      if (other->blocking) before.emplace_back(other, other->enqueued());
    }
  } else if (s.blocking) {
    before.emplace_back(Legacy(), Legacy()->enqueued());
  }
  if (!before.empty()) {
    s.Enqueue(Op{[before] {
                   for (auto& [other, ticket] : before) other->WaitFor(ticket);
                 },
                 nullptr, true});
  }
  s.Enqueue(std::move(op));
}

void SynchronizeAll() {
  std::vector<std::shared_ptr<CUstream_st>> all;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [raw, s] : r.streams) all.push_back(s);
  }
  for (auto& s : all) s->Synchronize();
  Legacy()->Synchronize();
}

bool LiveEvent(cudaEvent_t e) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events.count(e) != 0;
}
void AddEvent(cudaEvent_t e) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.insert(e);
}
void RemoveEvent(cudaEvent_t e) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.erase(e);
}
cudaStream_t AddStream(bool blocking) {
  auto s = std::make_shared<CUstream_st>(blocking, false);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.streams[s.get()] = s;
  return s.get();
}
std::shared_ptr<CUstream_st> RemoveStream(cudaStream_t s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.streams.find(s);
  if (it == r.streams.end()) return nullptr;
  std::shared_ptr<CUstream_st> out = std::move(it->second);
  r.streams.erase(it);
  return out;
}

}  // namespace kvtier::cudasim

CUstream_st::CUstream_st(bool blocking, bool legacy)
    : blocking(blocking),
      legacy(legacy),
      rng_(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(this) >> 4)),
      thread_([this] { Run(); }) {}

CUstream_st::~CUstream_st() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CUstream_st::Enqueue(kvtier::cudasim::Op op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  cv_.notify_all();
}

uint64_t CUstream_st::enqueued() {
  std::lock_guard<std::mutex> lock(mu_);
  return enqueued_;
}

void CUstream_st::WaitFor(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= ticket; });
}

void CUstream_st::Synchronize() { WaitFor(enqueued()); }

void CUstream_st::Run() {
  const uint32_t jitter = kvtier::cudasim::JitterMicros();
  for (;;) {
    kvtier::cudasim::Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    if (jitter > 0 && rng_() % 4 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % (jitter + 1)));
    }
    if (op.control || kvtier::cudasim::Sticky() == cudaSuccess) {
      kvtier::cudasim::current_kernel = op.name;
      op.run();
      kvtier::cudasim::current_kernel = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
    }
    cv_.notify_all();
  }
}
