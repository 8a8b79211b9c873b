#ifndef KVTIER_WORKER_CUDA_SIM_STREAMS_H_
#define KVTIER_WORKER_CUDA_SIM_STREAMS_H_

// Streams and events of the simulated device. A stream is an ordered queue run by its own
// thread; each operation may be delayed by a random few microseconds (KVTIER_CUDA_SIM_JITTER_US,
// default 50; 0 turns it off) so that unordered work on two streams interleaves differently from
// run to run. Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "worker/cuda/sim/cuda_runtime_sim.h"

namespace kvtier::cudasim {

// An event's completion state, shared with the operations that record or wait on it (an event
// may be destroyed while they are queued, as CUDA allows).
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // highest record that ran
};

struct Op {
  std::function<void()> run;
  const char* name = nullptr;  // kernel name, or null for runtime work
  bool control = false;        // runs even after a device fault (records, waits)
};

}  // namespace kvtier::cudasim

struct CUstream_st {
  CUstream_st(bool blocking, bool legacy);
  ~CUstream_st();  // drains the queue, then stops the thread
  void Enqueue(kvtier::cudasim::Op op);
  // Blocks until every operation enqueued before the call has run.
  void Synchronize();
  uint64_t enqueued();
  void WaitFor(uint64_t ticket);  // until `ticket` operations have run

  const bool blocking;  // orders against the legacy default stream
  const bool legacy;    // the legacy default stream itself

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<kvtier::cudasim::Op> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stop_ = false;
  std::mt19937 rng_;
  std::thread thread_;
};

struct CUevent_st {
  std::shared_ptr<kvtier::cudasim::EventState> state =
      std::make_shared<kvtier::cudasim::EventState>();
};

namespace kvtier::cudasim {

// The stream a call names: `s`, or the legacy default stream for null; null when `s` is not a
// live stream.
std::shared_ptr<CUstream_st> Resolve(cudaStream_t s);
// Enqueues op on `s`, with the legacy default stream's implicit ordering.
void Submit(CUstream_st& s, Op op);
// Every live stream, the legacy one included, synchronized.
void SynchronizeAll();

bool LiveEvent(cudaEvent_t e);
void AddEvent(cudaEvent_t e);
void RemoveEvent(cudaEvent_t e);
// A new stream, and its removal (null when `s` is not live; the caller drops the last
// reference, which drains it).
cudaStream_t AddStream(bool blocking);
std::shared_ptr<CUstream_st> RemoveStream(cudaStream_t s);

// The device's sticky fault (cudaSuccess until one happens).
cudaError_t Sticky();
void Fault(const char* kernel, const char* what, const void* p, uint64_t bytes);
// The thread's last error: set by every failing call, cleared by cudaGetLastError.
cudaError_t Fail(cudaError_t e);
// cudaGetLastError / cudaPeekAtLastError: the last error, else the sticky fault.
cudaError_t TakeLastError();
cudaError_t PeekLastError();

}  // namespace kvtier::cudasim

#endif  // KVTIER_WORKER_CUDA_SIM_STREAMS_H_
