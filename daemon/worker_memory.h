#ifndef KVTIER_DAEMON_WORKER_MEMORY_H_
#define KVTIER_DAEMON_WORKER_MEMORY_H_

// The node-wide budget of one pool and each worker's share of it. A worker's memory is a list
// of extents (daemon/extent.h) and the slots carved from them; slot offsets address the
// worker's extents back to back (extent i starts at i * extent_bytes), which is how the worker
// maps them. Another worker's pages are never in memory this worker holds a descriptor of.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layout/shm_abi.h"
#include "daemon/extent.h"
#include "daemon/slot_allocator.h"

namespace kvtier::daemon {

// What one pool may hand out in all: capacity bytes in extents of extent_bytes. Not
// thread-safe (the core's mutex serializes).
class PoolBudget {
 public:
  // `label` names the segments (visible in /proc/PID/maps); `dir` as in Extent::Create.
  PoolBudget(layout::PoolKind kind, uint64_t capacity, uint64_t extent_bytes, std::string label,
             std::string dir)
      : PoolBudget(kind, capacity, extent_bytes, std::move(label), ExtentSource{.dir = dir}) {}
  // Extents made from `source` (memfd or CUDA VMM); spares are always of that memory.
  PoolBudget(layout::PoolKind kind, uint64_t capacity, uint64_t extent_bytes, std::string label,
             ExtentSource source);

  // An extent of `memory` charged to the budget: a spare if one is ready, else a new one (slow:
  // the memory is reserved now). RESOURCE_EXHAUSTED when the budget has no extent left or the
  // memory cannot be reserved (a full tmpfs, memory the host cannot pin). Memfd extents of a
  // CUDA VMM pool are for workers that asked for them (v1::RegisterWorkerRequest.pool_memory).
  absl::StatusOr<Extent> Take(ExtentMemory memory);
  absl::StatusOr<Extent> Take() { return Take(source_.memory); }
  // A new extent of `memory`, not charged. Thread-safe (what it reads never changes).
  absl::StatusOr<Extent> MakeExtent(ExtentMemory memory) const;
  // An extent's descriptor was closed.
  void Return(uint64_t bytes);

  // Spares are made ahead, outside the core's lock, so that a grant seldom waits for fallocate:
  // WantsSpare says whether one more fits the budget and the target; BeginSpare charges it;
  // EndSpare files the made extent (or, on failure, gives the charge back).
  // Budgets of fewer than 8 extents keep no spares (they would pin a large share of it).
  bool WantsSpare(size_t target) const {
    return capacity_ / extent_bytes_ >= 8 && spares_.size() + making_ < target &&
           reserved_ + extent_bytes_ <= capacity_;
  }
  void BeginSpare() {
    reserved_ += extent_bytes_;
    ++making_;
  }
  void EndSpare(absl::StatusOr<Extent> extent);
  // Whether one more extent fits the budget (spare or not).
  bool CanReserve() const { return reserved_ + extent_bytes_ <= capacity_; }
  size_t ready_spares() const { return spares_.size(); }
  // Extents charged to the budget but held by no worker: ready spares and spares in the making.
  size_t unassigned() const { return spares_.size() + making_; }

  layout::PoolKind kind() const { return kind_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t extent_bytes() const { return extent_bytes_; }
  uint64_t reserved_bytes() const { return reserved_; }
  uint64_t extents_out() const { return reserved_ / extent_bytes_; }
  const std::string& label() const { return label_; }
  const std::string& dir() const { return source_.dir; }
  ExtentMemory memory() const { return source_.memory; }
  int numa_node() const { return source_.numa_node; }
  // Why the system last refused this pool an extent (a full tmpfs, a memory or file-size
  // limit: "reserve a 1 MiB extent in /dev/shm/x: No space left on device"); "" once an
  // extent was made again. Degraded plans quote it.
  const std::string& last_failure() const { return last_failure_; }

 private:
  void Note(const absl::Status& made);  // records or clears last_failure_

  const layout::PoolKind kind_;
  const uint64_t capacity_;
  const uint64_t extent_bytes_;
  const std::string label_;
  const ExtentSource source_;
  uint64_t reserved_ = 0;
  std::vector<Extent> spares_;
  size_t making_ = 0;
  std::string last_failure_;
};

// One worker's memory of one pool. Not thread-safe (the core's mutex serializes); every Slot
// must be released before it is destroyed, which returns its extents to the budget.
class WorkerMemory {
 public:
  // `budget` must outlive this. `tag` labels the slots' allocators (the pool index). Every
  // extent is of `memory` (the budget's unless the worker asked for memfd).
  WorkerMemory(PoolBudget* budget, int tag, uint64_t max_extents, Extent header)
      : WorkerMemory(budget, tag, max_extents, std::move(header), budget->memory()) {}
  WorkerMemory(PoolBudget* budget, int tag, uint64_t max_extents, Extent header,
               ExtentMemory memory);
  WorkerMemory(const WorkerMemory&) = delete;
  WorkerMemory& operator=(const WorkerMemory&) = delete;
  ~WorkerMemory();

  // A slot of `bytes` in the lowest extent with room, else in a new extent. RESOURCE_EXHAUSTED
  // when the worker holds max_extents already or the budget is short.
  absl::StatusOr<Slot> Allocate(uint64_t bytes);

  // Hands every extent over, still charged to the budget (the caller returns them once no
  // process holds them). REQUIRES: every slot released.
  std::vector<Extent> TakeExtents();

  // New extents the worker would take for `slots` more slots of `bytes`: an estimate from the
  // free bytes of the extents it holds (fragmentation aside), within max_extents.
  uint64_t ExtentsWanted(uint64_t slots, uint64_t bytes) const;

  uint32_t num_extents() const { return static_cast<uint32_t>(extents_.size()); }
  uint64_t max_extents() const { return max_extents_; }
  uint64_t extent_bytes() const { return budget_->extent_bytes(); }
  ExtentMemory memory() const { return memory_; }
  int extent_fd(uint32_t i) const { return extents_[i]->extent.fd(); }
  const Extent& extent(uint32_t i) const { return extents_[i]->extent; }
  int header_fd() const { return header_.fd(); }
  // Checks every extent's allocator.
  absl::Status CheckInvariants() const;

 private:
  void Adopt(Extent extent);  // as the next extent
  struct Held {
    Extent extent;
    SlotAllocator slots;
  };
  PoolBudget* const budget_;
  const int tag_;
  const uint64_t max_extents_;
  const ExtentMemory memory_;
  Extent header_;
  std::vector<std::unique_ptr<Held>> extents_;  // stable addresses: slots point at allocators
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_WORKER_MEMORY_H_
