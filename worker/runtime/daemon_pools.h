#ifndef KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_
#define KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_

// The store's view of one of the daemon's pools as the client maps it: the same range, the
// extents mapped so far, whether the daemon's memory is already pinned and device-mapped (CUDA
// VMM, which a CUDA backend then borrows instead of registering it again), and the mapping
// itself as the memory's owner (a CUDA backend's pin record keeps it mapped until unpinned).

#include <memory>

#include "kvtier/client.h"
#include "worker/page_pool.h"

namespace kvtier::worker {

class MappedPagePool final : public PagePool {
 public:
  MappedPagePool(PoolKind kind, std::shared_ptr<const PoolMapping> mapping)
      : kind_(kind), mapping_(std::move(mapping)) {}
  PoolKind kind() const override { return kind_; }
  uint8_t* base() const override { return mapping_->data(); }
  uint64_t size() const override { return mapping_->data_bytes(); }
  bool device_mapped() const override { return mapping_->device_mapped(); }
  uint64_t extent_bytes() const override { return mapping_->extent_bytes(); }
  std::function<uint64_t()> mapped_bytes_reader() const override {
    return [m = mapping_] { return uint64_t{m->mapped_extents()} * m->extent_bytes(); };
  }
  std::shared_ptr<const void> memory_owner() const override { return mapping_; }

 private:
  const PoolKind kind_;
  const std::shared_ptr<const PoolMapping> mapping_;
};

inline std::unique_ptr<PagePool> PoolOverMapping(PoolKind kind,
                                                 std::shared_ptr<const PoolMapping> mapping) {
  return std::make_unique<MappedPagePool>(kind, std::move(mapping));
}

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_
