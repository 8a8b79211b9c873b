#ifndef KVTIER_WORKER_CUDA_ARENA_BUFFERS_H_
#define KVTIER_WORKER_CUDA_ARENA_BUFFERS_H_

// Device working memory inside the worker's HBM budget: a CUDA store's staging slots, T2
// scratch, page tables, attention workspace and scores are carved from the device arena that
// holds its T0 blocks (docs/cuda.md, "The HBM budget"), so the budget the worker reports
// (RuntimeOptions::arena_bytes) is all the device memory its stores use, and a store that would
// exceed it is refused instead of allocating past it.

#include <cstdint>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "worker/device_arena.h"

namespace kvtier::worker::cuda {

// Not thread-safe: one owner (a store's backend or stager). The arena outlives it.
class ArenaBuffers {
 public:
  // `arena` null: cudaMalloc / cudaFree, outside any budget (a stager used on its own).
  explicit ArenaBuffers(DeviceArena* arena) : arena_(arena) {}
  // Frees what is left. REQUIRES: no queued device work still uses it (an arena's Free does not
  // synchronize the device as cudaFree does).
  ~ArenaBuffers();
  ArenaBuffers(const ArenaBuffers&) = delete;
  ArenaBuffers& operator=(const ArenaBuffers&) = delete;

  // `bytes` of device memory (256-byte aligned) for `what`. RESOURCE_EXHAUSTED naming `what`,
  // the bytes and the budget when the arena cannot hold them.
  template <typename T>
  absl::Status Allocate(T** p, uint64_t bytes, std::string_view what) {
    void* raw = nullptr;
    absl::Status s = AllocateRaw(&raw, bytes, what);
    *p = static_cast<T*>(raw);
    return s;
  }
  // REQUIRES: p came from Allocate and no queued device work uses it. Null is ignored.
  void Free(const void* p);
  uint64_t bytes() const { return bytes_; }  // held now

 private:
  absl::Status AllocateRaw(void** p, uint64_t bytes, std::string_view what);
  DeviceArena* arena_;
  absl::flat_hash_map<const void*, uint64_t> live_;
  uint64_t bytes_ = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_ARENA_BUFFERS_H_
