#include "daemon/block_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

namespace kvtier::daemon {
namespace {

constexpr std::array<const char*, BlockMetrics::kDomains> kDomainNames = {"shared", "private"};

void Add(prometheus::Counter* c, uint64_t before, uint64_t after) {
  if (after > before) c->Increment(static_cast<double>(after - before));
}

}  // namespace

BlockMetrics::BlockMetrics(prometheus::Registry& r) {
  auto counter = [&r](const char* name,
                      const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  auto gauge = [&r](const char* name, const char* help) -> prometheus::Family<prometheus::Gauge>& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(r);
  };
  auto& stored = counter("kvtier_blocks_stored_total", "Blocks published by a finished store.");
  auto& hits = counter("kvtier_blocks_hits_total", "Keys a block acquire found (and leased).");
  auto& misses = counter("kvtier_blocks_misses_total", "Keys a block acquire did not find.");
  auto& evicted =
      counter("kvtier_blocks_evicted_total", "Unread blocks evicted to make room for a store.");
  auto& dropped = counter("kvtier_blocks_dropped_total",
                          "Keys a block store was refused because every slot was pending or "
                          "leased (the engine drops the store).");
  auto& held = gauge("kvtier_blocks_held_bytes", "Bytes of published blocks.");
  auto& capacity = gauge("kvtier_blocks_capacity_bytes", "Bytes of the block spaces' slots.");
  auto& leases = gauge("kvtier_blocks_leases", "Block leases (acquires) not yet released.");
  for (int i = 0; i < kDomains; ++i) {
    const prometheus::Labels l{{"domain", kDomainNames[i]}};
    d_[i] = {&stored.Add(l),  &hits.Add(l), &misses.Add(l),   &evicted.Add(l),
             &dropped.Add(l), &held.Add(l), &capacity.Add(l), &leases.Add(l)};
  }
  owners_reaped_ = &counter("kvtier_blocks_owners_reaped_total",
                            "Processes that exited holding a pending block store or a lease; "
                            "the daemon dropped what they held.")
                        .Add({});
}

void BlockMetrics::CountMoved(Domain domain, const blocks::BlockSpaceStats& before,
                              const blocks::BlockSpaceStats& after) {
  const PerDomain& d = d_[static_cast<int>(domain)];
  Add(d.stored, before.stored, after.stored);
  Add(d.hits, before.hits, after.hits);
  Add(d.misses, before.misses, after.misses);
  Add(d.evicted, before.evictions, after.evictions);
  Add(d.dropped, before.stores_no_room, after.stores_no_room);
}

void BlockMetrics::SetHeld(Domain domain, uint64_t held_bytes, uint64_t capacity_bytes,
                           uint64_t leases) {
  const PerDomain& d = d_[static_cast<int>(domain)];
  d.held->Set(static_cast<double>(held_bytes));
  d.capacity->Set(static_cast<double>(capacity_bytes));
  d.leases->Set(static_cast<double>(leases));
}

void BlockMetrics::CountOwnersReaped(uint64_t n) {
  if (n > 0) owners_reaped_->Increment(static_cast<double>(n));
}

}  // namespace kvtier::daemon
