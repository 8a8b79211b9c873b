#ifndef KVTIER_WORKER_DEVICE_ARENA_H_
#define KVTIER_WORKER_DEVICE_ARENA_H_

// T0: the worker's device arena (HBM on CUDA; host memory on the CPU backend), with a byte
// budget shared by every sequence of the worker.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvtier::worker {

// Implementations are thread-safe (several sequences share one arena).
class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  // A block of `bytes`, 64-byte aligned, contents unspecified. RESOURCE_EXHAUSTED past the
  // budget.
  virtual absl::StatusOr<uint8_t*> Allocate(uint64_t bytes) = 0;
  // REQUIRES: `block` came from Allocate(bytes) of this arena and is not freed yet.
  virtual void Free(uint8_t* block, uint64_t bytes) = 0;
  virtual uint64_t capacity_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  // True when the CPU can read blocks directly (the CPU backend): attention reads in place.
  virtual bool host_accessible() const = 0;
};

// Host-memory arena for the CPU backend. Blocks are carved from large slabs (2 MiB aligned,
// advised for transparent huge pages: attention streams whole pages, and 4 KiB pages would cost
// a TLB miss every few positions). Freed blocks are cached per size and reused (pages of one
// geometry have one or a few sizes), so promotions pay no mapping or page fault. Memory goes
// back to the system when the arena is destroyed. Thread-safe.
class HostArena final : public DeviceArena {
 public:
  explicit HostArena(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  ~HostArena() override;
  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes) override;
  void Free(uint8_t* block, uint64_t bytes) override;
  uint64_t capacity_bytes() const override { return capacity_; }
  uint64_t used_bytes() const override;
  uint64_t peak_bytes() const;
  // Bytes mapped from the system (slabs), for tests and metrics.
  uint64_t mapped_bytes() const;
  bool host_accessible() const override { return true; }

 private:
  const uint64_t capacity_;
  // std::mutex: taken twice per page move; absl::Mutex costs more per call in Debian's build.
  mutable std::mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::vector<uint8_t*>> cached_ ABSL_GUARDED_BY(mu_);
  struct Slab {
    uint8_t* base;
    uint64_t size;
  };
  std::vector<Slab> slabs_ ABSL_GUARDED_BY(mu_);
  uint64_t slab_used_ ABSL_GUARDED_BY(mu_) = 0;  // bytes carved from slabs_.back()
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_DEVICE_ARENA_H_
