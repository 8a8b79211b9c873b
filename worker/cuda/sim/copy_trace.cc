#include "worker/cuda/sim/copy_trace.h"

#include <atomic>
#include <mutex>

namespace kvtier::cudasim {
namespace {

std::atomic<bool> on{false};
std::mutex mu;
std::vector<TracedCopy>& Trace() {
  static auto* trace = new std::vector<TracedCopy>;
  return *trace;
}

}  // namespace

void StartCopyTrace() {
  std::lock_guard<std::mutex> lock(mu);
  Trace().clear();
  on = true;
}

std::vector<TracedCopy> TakeCopyTrace() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<TracedCopy> out;
  out.swap(Trace());
  return out;
}

void StopCopyTrace() {
  std::lock_guard<std::mutex> lock(mu);
  on = false;
  Trace().clear();
}

void TraceCopy(const void* src, void* dst, size_t bytes) {
  if (!on) return;
  std::lock_guard<std::mutex> lock(mu);
  if (on) Trace().push_back({src, dst, bytes});
}

}  // namespace kvtier::cudasim
