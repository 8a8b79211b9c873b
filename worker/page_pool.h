#ifndef KVTIER_WORKER_PAGE_POOL_H_
#define KVTIER_WORKER_PAGE_POOL_H_

// Host pools that hold offloaded pages (T1: DDR pool, T2: compressed pool), and where their
// slots come from. A pool is just a byte region (base + size); slot offsets are granted either
// by the daemon (the worker maps the daemon's shared-memory segments) or, in local mode, by a
// LocalSlotAllocator. The tiered store only ever needs a PagePool per kind and, for local-mode
// plan execution, a SlotSource.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout/shm_abi.h"

namespace kvtier::worker {

using layout::PoolKind;

// A byte region holding slots of one kind. Offsets are relative to base(). The region outlives
// every store using it. Implementations are thread-safe (the region itself is plain memory;
// writers coordinate through slot ownership).
class PagePool {
 public:
  virtual ~PagePool() = default;
  virtual PoolKind kind() const = 0;
  virtual uint8_t* base() const = 0;
  virtual uint64_t size() const = 0;
  // True when the memory is already pinned and mapped for the GPUs (the daemon's CUDA VMM
  // pools): a CUDA backend then registers nothing of its own.
  virtual bool device_mapped() const { return false; }
  // A daemon pool is mapped extent by extent: only the first bytes the reader returns (whole
  // extents of extent_bytes()) are memory, the rest of the range is reserved address space that
  // must not be pinned (worker/cuda/pin_ledger.h). A local pool is one extent, all mapped. The
  // reader holds what it reads: a pin record may outlive the pool object that made it.
  virtual uint64_t extent_bytes() const { return size(); }
  virtual std::function<uint64_t()> mapped_bytes_reader() const {
    return [n = size()] { return n; };
  }
  // What keeps the memory mapped (the client's mapping), shared by every pool over it; null when
  // the pool owns its memory. A pin record holds it, so memory is unpinned before it is unmapped,
  // and is keyed by it, so a new mapping at a reused address is pinned afresh.
  virtual std::shared_ptr<const void> memory_owner() const { return nullptr; }
};

// A pool over memory someone else owns and maps (e.g. the daemon's extents mapped by the
// client). Never frees it.
class ExternalPagePool final : public PagePool {
 public:
  ExternalPagePool(PoolKind kind, uint8_t* base, uint64_t size, bool device_mapped = false)
      : kind_(kind), base_(base), size_(size), device_mapped_(device_mapped) {}
  PoolKind kind() const override { return kind_; }
  uint8_t* base() const override { return base_; }
  uint64_t size() const override { return size_; }
  bool device_mapped() const override { return device_mapped_; }

 private:
  PoolKind kind_;
  uint8_t* base_;
  uint64_t size_;
  bool device_mapped_;
};

// A pool over plain host memory it owns (local mode, tests, CPU-only runs). 4 KiB aligned,
// zero-filled.
class HostPagePool final : public PagePool {
 public:
  // INVALID_ARGUMENT when size is 0; RESOURCE_EXHAUSTED when the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<HostPagePool>> Create(PoolKind kind, uint64_t size);
  ~HostPagePool() override;
  HostPagePool(const HostPagePool&) = delete;
  HostPagePool& operator=(const HostPagePool&) = delete;

  PoolKind kind() const override { return kind_; }
  uint8_t* base() const override { return base_; }
  uint64_t size() const override { return size_; }

 private:
  HostPagePool(PoolKind kind, uint8_t* base, uint64_t size)
      : kind_(kind), base_(base), size_(size) {}
  PoolKind kind_;
  uint8_t* base_;
  uint64_t size_;
};

// Grants and takes back slots. The daemon client implements it over gRPC; LocalSlotAllocator
// implements it in process. Implementations are thread-safe.
class SlotSource {
 public:
  virtual ~SlotSource() = default;
  // Offset of a slot of at least `bytes` in the pool of `kind`, a multiple of
  // layout::kSlotAlignment. RESOURCE_EXHAUSTED when the pool is full.
  virtual absl::StatusOr<uint64_t> AllocateSlot(PoolKind kind, uint64_t bytes) = 0;
  // INVALID_ARGUMENT when `offset` is not a slot currently granted in that pool.
  virtual absl::Status Free(PoolKind kind, uint64_t offset) = 0;
};

// Size-class free-list allocator over fixed regions [data_begin, size) of each registered pool.
// A request is rounded up to layout::kSlotAlignment; each rounded size is a class with its own
// free list, refilled by bumping a cursor. Freed slots are reused only by the same class (pages
// of one geometry use one or two sizes, so fragmentation stays bounded). Thread-safe.
class LocalSlotAllocator final : public SlotSource {
 public:
  struct PoolSpec {
    PoolKind kind;
    uint64_t size;            // bytes of the region
    uint64_t data_begin = 0;  // first usable offset (kPoolDataOffset over a shm segment)
  };
  explicit LocalSlotAllocator(const std::vector<PoolSpec>& pools);

  absl::StatusOr<uint64_t> AllocateSlot(PoolKind kind, uint64_t bytes) override;
  absl::Status Free(PoolKind kind, uint64_t offset) override;

  // Bytes currently granted in `kind` (rounded sizes).
  uint64_t GrantedBytes(PoolKind kind) const;
  uint64_t GrantedSlots(PoolKind kind) const;

 private:
  struct Region {
    uint64_t size = 0;
    uint64_t cursor = 0;
    uint64_t granted_bytes = 0;
    absl::flat_hash_map<uint64_t, std::vector<uint64_t>> free_by_class;
    absl::flat_hash_map<uint64_t, uint64_t> class_of_granted;  // offset -> rounded size
  };
  absl::StatusOr<Region*> FindRegion(PoolKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Region> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_PAGE_POOL_H_
