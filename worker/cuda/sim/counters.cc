#include "worker/cuda/sim/counters.h"

#include <array>
#include <atomic>

namespace kvtier::cudasim {
namespace {

constexpr size_t kCounters = 7;
std::array<std::atomic<uint64_t>, kCounters> counts{};

uint64_t Get(Counter c) { return counts[static_cast<size_t>(c)].load(std::memory_order_relaxed); }

}  // namespace

void Count(Counter c, uint64_t n) {
  counts[static_cast<size_t>(c)].fetch_add(n, std::memory_order_relaxed);
}

Counters ReadCounters() {
  return {.runtime_calls = Get(Counter::kRuntimeCall),
          .kernel_launches = Get(Counter::kKernelLaunch),
          .copy_calls = Get(Counter::kCopyCall),
          .copy_descriptors = Get(Counter::kCopyDescriptor),
          .h2d_bytes = Get(Counter::kH2dBytes),
          .host_waits = Get(Counter::kHostWait),
          .event_queries = Get(Counter::kEventQuery)};
}

void ResetCounters() {
  for (std::atomic<uint64_t>& c : counts) c.store(0, std::memory_order_relaxed);
}

}  // namespace kvtier::cudasim
