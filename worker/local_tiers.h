#ifndef KVTIER_WORKER_LOCAL_TIERS_H_
#define KVTIER_WORKER_LOCAL_TIERS_H_

// Everything a worker needs to run tiered stores without a daemon (local mode, tests, the CPU
// reference engine): a host arena for T0, host pools for T1 and T2, and a local slot allocator
// over them. One LocalTiers serves any number of stores; it must outlive them.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/device_arena.h"
#include "worker/page_pool.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

struct LocalTiersOptions {
  uint64_t arena_bytes = uint64_t{1} << 30;         // T0 budget
  uint64_t ddr_bytes = uint64_t{1} << 30;           // T1 pool; 0 = no T1
  uint64_t compressed_bytes = uint64_t{256} << 20;  // T2 pool; 0 = no T2
};

// Thread-safe (its parts are).
class LocalTiers {
 public:
  // INVALID_ARGUMENT when arena_bytes is 0; RESOURCE_EXHAUSTED when memory cannot be mapped.
  static absl::StatusOr<std::unique_ptr<LocalTiers>> Create(const LocalTiersOptions& options);

  StoreMemory memory() const { return {arena_.get(), ddr_.get(), compressed_.get()}; }
  HostArena& arena() { return *arena_; }
  LocalSlotAllocator& slots() { return *slots_; }

  // A store over these tiers; give its plans to ApplyPlanLocal(moves, slots()).
  absl::StatusOr<std::unique_ptr<TieredKvStore>> NewStore(const TieredKvStoreOptions& options) {
    return TieredKvStore::Create(options, memory());
  }

 private:
  LocalTiers() = default;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<HostPagePool> ddr_, compressed_;
  std::unique_ptr<LocalSlotAllocator> slots_;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_LOCAL_TIERS_H_
