#ifndef KVTIER_WORKER_CUDA_PINNED_MAPPING_H_
#define KVTIER_WORKER_CUDA_PINNED_MAPPING_H_

// Pins a host mapping (a daemon pool mapped by the worker) for asynchronous DMA:
// cudaHostRegister with the portable and mapped flags, unit by unit (worker/cuda/pin_ledger.h:
// at most a chunk, never across an extent, only inside the extents mapped so far). Registering
// hundreds of GB at once takes seconds, so start-up pins nothing unless asked and each unit is
// pinned the first time a copy touches it (EnsurePinned). Copies must not span two units: cut
// them with CoalesceRuns(..., chunk_bytes()).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/pin_ledger.h"
#include "worker/page_pool.h"

namespace kvtier::worker::cuda {

struct PinnedMappingOptions {
  uint64_t chunk_bytes = uint64_t{256} << 20;  // multiple of 4096
  bool pin_all_now = false;
  // The memory is pinned and mapped for the devices already (a CUDA VMM pool of the daemon's:
  // PoolMapping::device_mapped()): nothing is registered or unregistered, and every chunk counts
  // as pinned.
  bool already_pinned = false;
  // The pool's extents (0: one extent, the whole mapping) and how many bytes of them are mapped
  // now (null: all).
  uint64_t extent_bytes = 0;
  std::function<uint64_t()> mapped_bytes;
  // Kept until everything is unpinned: what keeps the memory mapped (PagePool::memory_owner).
  std::shared_ptr<const void> owner;
};

// Thread-safe. Does not own the mapping, which must outlive it; unregisters what it pinned.
class PinnedMapping {
 public:
  // INVALID_ARGUMENT for a null base, 0 size, base not 4096-aligned, a bad chunk or extent size;
  // the CUDA error (converted) when pin_all_now and a registration fails.
  static absl::StatusOr<std::unique_ptr<PinnedMapping>> Create(uint8_t* base, uint64_t size,
                                                               PinnedMappingOptions options);
  // The same over a worker PagePool (the daemon's T1 or T2 segment as the client mapped it):
  // its extents, its mapped bytes, its memory's owner, whether it is device-mapped already.
  static absl::StatusOr<std::unique_ptr<PinnedMapping>> ForPool(const PagePool& pool,
                                                                PinnedMappingOptions options);
  ~PinnedMapping();
  PinnedMapping(const PinnedMapping&) = delete;
  PinnedMapping& operator=(const PinnedMapping&) = delete;

  // Pins every unit [offset, offset + bytes) touches that is not pinned yet.
  // OUT_OF_RANGE when the range leaves the mapping; FAILED_PRECONDITION when it reaches past the
  // mapped extents (nothing is asked of the driver).
  absl::Status EnsurePinned(uint64_t offset, uint64_t bytes) {
    return ledger_->EnsurePinned(offset, bytes);
  }
  absl::Status PinAll() { return EnsurePinned(0, size()); }
  bool IsPinned(uint64_t offset, uint64_t bytes) const { return ledger_->IsPinned(offset, bytes); }

  uint8_t* base() const { return base_; }
  uint64_t size() const { return ledger_->size(); }
  // The registration unit: copies are cut at its multiples.
  uint64_t chunk_bytes() const { return ledger_->unit_bytes(); }
  uint64_t pinned_bytes() const { return ledger_->pinned_bytes(); }

 private:
  PinnedMapping(uint8_t* base, std::shared_ptr<const void> owner)
      : base_(base), owner_(std::move(owner)) {}

  uint8_t* const base_;
  // Declared before the ledger: destroyed after it, so the memory is unpinned, then unmapped.
  const std::shared_ptr<const void> owner_;
  std::unique_ptr<PinLedger> ledger_;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_PINNED_MAPPING_H_
