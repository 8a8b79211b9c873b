#ifndef KVTIER_WORKER_STORE_BACKENDS_H_
#define KVTIER_WORKER_STORE_BACKENDS_H_

// What the stores of one worker share on a backend other than the host (the T0 arena, pinned
// pool registrations, the engine's stream), and the factory of their per-store backends.
// WorkerRuntime holds one; worker/cuda/cuda_kv_backend.h makes the CUDA one.

#include <memory>

#include "absl/status/statusor.h"
#include "worker/device_arena.h"
#include "worker/kv_backend.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

// Implementations are thread-safe: sequences may be opened from several threads.
class StoreBackends {
 public:
  virtual ~StoreBackends() = default;
  // T0 of every store of the worker.
  virtual DeviceArena& arena() = 0;
  // A backend for one store built with `options`. INVALID_ARGUMENT naming the field for an
  // option the backend cannot serve.
  virtual absl::StatusOr<std::unique_ptr<KvBackend>> MakeBackend(
      const TieredKvStoreOptions& options) = 0;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_STORE_BACKENDS_H_
