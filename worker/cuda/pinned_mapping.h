#ifndef KVTIER_WORKER_CUDA_PINNED_MAPPING_H_
#define KVTIER_WORKER_CUDA_PINNED_MAPPING_H_

// Pins a host mapping (a daemon pool mapped by the worker) for asynchronous DMA:
// cudaHostRegister with the portable and mapped flags, chunk by chunk. Registering hundreds of
// GB at once takes seconds, so start-up pins nothing unless asked and each chunk is pinned the
// first time a copy touches it (EnsurePinned). Copies must not span two chunks: cut them with
// CoalesceRuns(..., chunk_bytes()).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/page_pool.h"

namespace kvtier::worker::cuda {

struct PinnedMappingOptions {
  uint64_t chunk_bytes = uint64_t{256} << 20;  // multiple of 4096
  bool pin_all_now = false;
  // The memory is pinned and mapped for the devices already (a CUDA VMM pool of the daemon's:
  // PoolMapping::device_mapped()): nothing is registered or unregistered, and every chunk counts
  // as pinned.
  bool already_pinned = false;
};

// Thread-safe. Does not own the mapping, which must outlive it; unregisters what it pinned.
class PinnedMapping {
 public:
  // INVALID_ARGUMENT for a null base, 0 size, base not 4096-aligned or a bad chunk size; the
  // CUDA error (converted) when pin_all_now and a registration fails.
  static absl::StatusOr<std::unique_ptr<PinnedMapping>> Create(uint8_t* base, uint64_t size,
                                                               PinnedMappingOptions options);
  // The same over a worker PagePool (the daemon's T1 or T2 segment as the client mapped it).
  static absl::StatusOr<std::unique_ptr<PinnedMapping>> ForPool(const PagePool& pool,
                                                                PinnedMappingOptions options) {
    return Create(pool.base(), pool.size(), options);
  }
  ~PinnedMapping();
  PinnedMapping(const PinnedMapping&) = delete;
  PinnedMapping& operator=(const PinnedMapping&) = delete;

  // Pins every chunk [offset, offset + bytes) touches that is not pinned yet.
  // OUT_OF_RANGE when the range leaves the mapping.
  absl::Status EnsurePinned(uint64_t offset, uint64_t bytes);
  absl::Status PinAll() { return EnsurePinned(0, size_); }
  bool IsPinned(uint64_t offset, uint64_t bytes) const;

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t pinned_bytes() const;

 private:
  PinnedMapping(uint8_t* base, uint64_t size, uint64_t chunk_bytes, size_t chunks, bool borrowed)
      : base_(base),
        size_(size),
        chunk_bytes_(chunk_bytes),
        borrowed_(borrowed),
        pinned_(chunks, borrowed) {}

  uint8_t* const base_;
  const uint64_t size_;
  const uint64_t chunk_bytes_;
  const bool borrowed_;  // already_pinned: pinned by someone else, never unregistered here
  mutable absl::Mutex mu_;
  std::vector<bool> pinned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_PINNED_MAPPING_H_
