#ifndef KVTIER_WORKER_RUNTIME_WORKER_RUNTIME_H_
#define KVTIER_WORKER_RUNTIME_WORKER_RUNTIME_H_

// libkvtier_worker's entry point: the memory every sequence of a worker process shares (the T0
// arena; the daemon's pools or local ones) and the factory of TieredSequences.
//
//   auto runtime = WorkerRuntime::Create({.attention = shape, .daemon_address = "unix:..."});
//   auto seq = (*runtime)->Open({.policy = "hierarchy", .prompt_tokens = n});
//   engine.Prefill(prompt, **seq); ... engine.Decode(**seq) ...;  // re-tiers on its own
//   (*seq)->Report();

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/attention_cache.h"
#include "worker/device_arena.h"
#include "worker/page_pool.h"
#include "worker/runtime/tiered_sequence.h"
#include "worker/store_backends.h"

namespace kvtier {
class WorkerClient;
}

namespace kvtier::worker {

// Where T0 lives and what runs attention (the seam with the engine: docs/cuda.md).
enum class StoreBackend : uint8_t { kHost = 0, kCuda = 1 };

struct RuntimeOptions {
  AttentionShape attention;  // the model's attention (layers, heads, head_dim)
  uint32_t page_tokens = 16;
  uint32_t layer_groups = 1;
  std::string codec = "int8_kivi";  // T2 codec (worker/codecs)
  // "" = local mode (pools in this process); else kvtierd's address ("unix:/run/kvtier/...").
  std::string daemon_address;
  std::string worker_name = "kvtier-worker";
  // Daemon mode: the CUDA driver library that maps CUDA VMM pools (ClientOptions::cuda_library).
  std::string cuda_library = "libcuda.so.1";
  // T0 budget: host memory on kHost; on kCuda the HBM of T0 and of every store's working
  // memory (staging, T2 scratch, launch buffers: cuda::StoreWorkingBytes each).
  uint64_t arena_bytes = 8ull << 30;
  // kCuda: T0 in HBM, T1/T2 pool memory pinned for DMA, attention and scores on the device;
  // sequences then take device pointers (TieredSequence). Create fails with
  // FAILED_PRECONDITION on a build without CUDA or a machine without a device.
  StoreBackend backend = StoreBackend::kHost;
  // kCuda: the engine's compute stream (a cudaStream_t); null = the default stream.
  void* cuda_stream = nullptr;
  // Bytes of a stored KV element: 4 = f32 (every backend), 2 = bf16 (kCuda only: the engine
  // still hands f32 rows, the store rounds them). Slot sizes and T0/T1 bytes follow it.
  uint32_t kv_element_bytes = 4;
  uint64_t local_ddr_bytes = 2ull << 30;
  uint64_t local_compressed_bytes = 1ull << 30;
  bool portable_kernel = false;  // force the portable attention kernel
  // Daemon mode: the host link to declare for prefetch schedules (docs/scheduling.md); unset =
  // none (no schedules, attention unsplit). The CPU backend follows a schedule by attending the
  // pages it leaves in place as a second partial (split attention).
  v1::HostLink link;
};

// Thread-safe: sequences may be opened from several threads; each sequence is single-threaded.
class WorkerRuntime {
 public:
  // Daemon mode registers with kvtierd (UNAVAILABLE, with the address, when it cannot be
  // reached); local mode maps its own pools (untouched memory costs nothing until used).
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(const RuntimeOptions& options);
  ~WorkerRuntime();

  // A new sequence. INVALID_ARGUMENT naming the field for an unknown policy or bad budgets;
  // in daemon mode the daemon validates them too.
  absl::StatusOr<std::unique_ptr<TieredSequence>> Open(const SequenceOptions& options);

  bool daemon_mode() const { return client_ != nullptr; }
  WorkerClient* client() const { return client_.get(); }
  const layout::KvGeometry& geometry() const { return geometry_; }
  const DeviceArena& arena() const { return *arena_; }
  StoreBackend backend() const { return options_.backend; }

 private:
  WorkerRuntime(const RuntimeOptions& options, layout::KvGeometry geometry);
  absl::Status CreateLocalPools();
  absl::Status CreateBackends();
  absl::StatusOr<std::unique_ptr<TieredKvStore>> MakeStore(const TieredKvStoreOptions& options,
                                                           const StoreMemory& memory);

  RuntimeOptions options_;
  layout::KvGeometry geometry_;
  // Declared first, destroyed last: every store's backend goes before what they share.
  std::unique_ptr<StoreBackends> backends_;  // null on kHost
  std::unique_ptr<HostArena> host_arena_;    // kHost
  DeviceArena* arena_ = nullptr;             // T0: host_arena_ or backends_->arena()
  std::unique_ptr<WorkerClient> client_;
  std::unique_ptr<HostPagePool> local_ddr_, local_compressed_;
  std::unique_ptr<LocalSlotAllocator> local_slots_;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_WORKER_RUNTIME_H_
