#ifndef KVTIER_DAEMON_BLOCK_METRICS_H_
#define KVTIER_DAEMON_BLOCK_METRICS_H_

// The block store's Prometheus metrics (daemon/block_index.h, docs/vllm.md), registered in the
// daemon's registry by Metrics::Create. One label, domain = "shared" (the uids of
// [blocks] shared_uids) | "private" (every other uid, each a domain of its own): never a key, a
// space or a process.
//
//   kvtier_blocks_stored_total{domain}    counter blocks published by a finished store
//   kvtier_blocks_hits_total{domain}      counter keys an acquire found (and leased)
//   kvtier_blocks_misses_total{domain}    counter keys an acquire did not find
//   kvtier_blocks_evicted_total{domain}   counter unread blocks evicted to make room for a store
//   kvtier_blocks_dropped_total{domain}   counter keys a store was refused: every slot pending
//                                                 or leased (the engine drops the store)
//   kvtier_blocks_held_bytes{domain}      gauge   bytes of published blocks
//   kvtier_blocks_capacity_bytes{domain}  gauge   bytes of the spaces' block slots
//   kvtier_blocks_leases{domain}          gauge   leases (acquires) not yet released
//   kvtier_blocks_owners_reaped_total     counter processes that exited holding a pending store
//                                                 or a lease, whose holdings the daemon dropped

#include <array>
#include <cstdint>

#include "core/blocks/block_space.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
}  // namespace prometheus

namespace kvtier::daemon {

// Thread-safe: prometheus metric objects are atomic.
class BlockMetrics {
 public:
  enum class Domain : int { kShared, kPrivate, kCount };
  static constexpr int kDomains = static_cast<int>(Domain::kCount);

  explicit BlockMetrics(prometheus::Registry& registry);

  // Adds what one space's cumulative figures moved from `before` to `after`.
  void CountMoved(Domain domain, const blocks::BlockSpaceStats& before,
                  const blocks::BlockSpaceStats& after);
  // Sums over the spaces of one domain kind.
  void SetHeld(Domain domain, uint64_t held_bytes, uint64_t capacity_bytes, uint64_t leases);
  void CountOwnersReaped(uint64_t n);

 private:
  struct PerDomain {
    prometheus::Counter* stored = nullptr;
    prometheus::Counter* hits = nullptr;
    prometheus::Counter* misses = nullptr;
    prometheus::Counter* evicted = nullptr;
    prometheus::Counter* dropped = nullptr;
    prometheus::Gauge* held = nullptr;
    prometheus::Gauge* capacity = nullptr;
    prometheus::Gauge* leases = nullptr;
  };
  std::array<PerDomain, kDomains> d_{};
  prometheus::Counter* owners_reaped_ = nullptr;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCK_METRICS_H_
