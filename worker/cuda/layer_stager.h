#ifndef KVTIER_WORKER_CUDA_LAYER_STAGER_H_
#define KVTIER_WORKER_CUDA_LAYER_STAGER_H_

// Moves KV between the pinned host pools and the GPU, off the compute stream.
//
// Prefetch (host -> device, its own stream): Prefetch(l) copies what layer l's attention needs
// from the T1 pool (and the T2 pool, dequantized on the device) into staging slot
// l % num_slots, once the compute work that last read that slot is done (Release). The decode
// loop calls Prefetch(l + 1) before computing layer l, Acquire(l) before layer l's attention and
// Release(l) after it: copies of the next layer overlap the current layer's compute. Planning is
// differential (StagingPlanner): unchanged staged pages are not copied again.
//
// Resident area (prefetch schedules, docs/cuda.md): one slot per layer, kept across steps, for
// the pages a schedule keeps staged. PrefetchResident(l) copies only what is missing or changed
// of layer l's resident pages, on the same host-to-device stream; Acquire / Release(l) cover it
// together with layer l's staging slot.
//
// Offload (device -> host, the other stream): Offload copies T0 blocks into T1 slots;
// OffloadCompressed quantizes blocks on the device (same format as the CPU codecs) and copies the
// codes into T2 slots. Both start after the work queued so far on the producing stream.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cuda/arena_buffers.h"
#include "worker/cuda/copy_engine.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/cuda/scratch_ring.h"
#include "worker/cuda/staging_plan.h"
#include "worker/kernels/cuda/kv_ops.h"

namespace kvtier::worker::cuda {

struct LayerStagerOptions {
  uint32_t num_slots = 2;         // 2 = double-buffered
  uint32_t entries_per_slot = 0;  // most pages one layer stages
  // One layer's block of one page: K [page_tokens][kv_heads][head_dim] then V, of `dtype`.
  uint32_t page_tokens = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  kernels::cuda::KvDtype dtype = kernels::cuda::KvDtype::kBf16;
  // T2 format; compressed block = encoded K then encoded V.
  kernels::cuda::CodecKind codec = kernels::cuda::CodecKind::kInt8Kivi;
  uint32_t max_offload_batch = 1024;  // blocks per OffloadCompressed call
  // Where the slots and the T2 scratch live: the worker's device arena (inside its HBM budget),
  // or, null, their own cudaMalloc. Not owned; outlives the stager.
  DeviceArena* arena = nullptr;

  uint64_t BlockBytes() const;
  uint64_t CompressedKeyBytes() const;
  uint64_t CompressedBlockBytes() const;
  // Device bytes of one entry of a staging slot (its block; with a T2 pool also the entry's
  // codes and dequantization pointers) and of one T2 scratch entry (codes and pointers).
  uint64_t SlotEntryBytes(bool t2) const;
  uint64_t ScratchEntryBytes() const;
};

// Where one staged request lives on the device (valid until the slot's next Prefetch).
struct StagedLayer {
  uint32_t slot = 0;
  std::vector<uint8_t*> blocks;  // per request, in request order
  uint64_t copied_bytes = 0;     // host -> device bytes this call issued
  uint32_t reused = 0;
  // Copy calls this call issued, the descriptors they carried, and how many calls went through
  // the batch API (CopyIssuer).
  uint64_t copy_calls = 0;
  uint64_t copy_descriptors = 0;
  uint64_t batched_calls = 0;
};

struct OffloadOp {
  const uint8_t* src = nullptr;  // device block (BlockBytes())
  uint64_t dst_offset = 0;       // pool offset of the destination slot
};

// A block brought back to the device for good (a promotion): from the T1 pool, or from the T2
// pool as codes dequantized on the device.
struct RestoreOp {
  uint64_t src_offset = 0;  // pool offset of the block (full, or encoded K then V)
  uint8_t* dst = nullptr;   // device block, BlockBytes()
  StageSource source = StageSource::kFull;
};

// Not thread-safe: one decode loop drives it. The pools must outlive it.
class LayerStager {
 public:
  // `t2_pool` may be null (no T2). INVALID_ARGUMENT for a bad option naming it.
  static absl::StatusOr<std::unique_ptr<LayerStager>> Create(const LayerStagerOptions& options,
                                                             PinnedMapping* t1_pool,
                                                             PinnedMapping* t2_pool);
  ~LayerStager();
  LayerStager(const LayerStager&) = delete;
  LayerStager& operator=(const LayerStager&) = delete;

  // FAILED_PRECONDITION when the slot still holds another layer that was prefetched and not
  // released: its attention has not been enqueued, so overwriting the slot would feed it the
  // wrong layer (the caller must release it first, or prefetch later).
  absl::StatusOr<StagedLayer> Prefetch(uint32_t layer, absl::Span<const StageRequest> requests);
  // True when Prefetch(layer) may be called now.
  bool CanPrefetch(uint32_t layer) const;
  // A resident area of `layers` slots of at least `entries` blocks each (growing it drops what
  // it held: those pages are copied again). The caller makes sure no queued work still reads it.
  absl::Status EnsureResident(uint32_t layers, uint32_t entries);
  // Layer `layer`'s resident pages in its resident slot (REQUIRES layer < the resident layers):
  // only missing or changed pages are copied; pages of the slot not requested are dropped.
  absl::StatusOr<StagedLayer> PrefetchResident(uint32_t layer,
                                               absl::Span<const StageRequest> requests);
  uint32_t resident_layers() const { return static_cast<uint32_t>(resident_slots_.size()); }
  uint32_t resident_entries() const { return resident_entries_; }
  // `compute` waits for layer's copies.
  absl::Status Acquire(uint32_t layer, cudaStream_t compute);
  // The slot may be overwritten once the work queued so far on `compute` is done.
  absl::Status Release(uint32_t layer, cudaStream_t compute);

  absl::Status Offload(absl::Span<const OffloadOp> ops, cudaStream_t producer);
  absl::Status OffloadCompressed(absl::Span<const OffloadOp> ops, cudaStream_t producer);
  // Blocks the host until every offload issued so far has landed.
  absl::Status WaitOffloads();
  // Copies (and dequantizes) `ops` on the host-to-device stream, after every offload issued so
  // far (it may be writing a source); `consumer` waits for them before its later work.
  absl::Status Restore(absl::Span<const RestoreOp> ops, cudaStream_t consumer);

  cudaStream_t h2d_stream() const { return h2d_; }
  cudaStream_t d2h_stream() const { return d2h_; }
  uint64_t h2d_bytes() const { return h2d_bytes_; }
  uint64_t d2h_bytes() const { return d2h_bytes_; }
  // Times the host blocked on the T2 scratch: a batch reusing entries whose earlier batch had not
  // completed yet (ScratchRing; a page in a row never waits for the page before it).
  uint64_t scratch_host_waits() const { return scratch_host_waits_; }
  const LayerStagerOptions& options() const { return options_; }

 private:
  struct Slot {
    uint8_t* blocks = nullptr;      // entries * BlockBytes(), device
    uint8_t* compressed = nullptr;  // entries * CompressedBlockBytes(), device (T2 only)
    void** ptrs_dev = nullptr;      // 4 * entries device pointers for dequantization
    void** ptrs_host = nullptr;     // pinned mirror
    cudaEvent_t copied = nullptr;
    cudaEvent_t consumed = nullptr;
    bool copy_pending = false;
    int64_t unreleased_layer = -1;  // prefetched and not yet Release()d; -1 = none
  };
  LayerStager(const LayerStagerOptions& options, PinnedMapping* t1, PinnedMapping* t2,
              StagingPlanner planner)
      : options_(options), t1_(t1), t2_(t2), planner_(std::move(planner)) {}
  absl::Status Init();
  absl::Status AllocateSlot(Slot& slot, uint64_t entries);
  void FreeSlot(Slot& slot);
  // Plans `requests` into `slot` (planned by `planner`) and issues the copies.
  absl::StatusOr<StagedLayer> StageInto(StagingPlanner& planner, std::vector<Slot>& slots,
                                        uint32_t layer, absl::Span<const StageRequest> requests);
  absl::Status EnsureSourcesPinned(absl::Span<const StageRequest> requests);
  absl::Status DequantizeInto(Slot& slot, const LayerStagePlan& plan);
  absl::Status RestoreCompressed(absl::Span<const RestoreOp> ops);
  // Dequantizes n blocks on the H2D stream; ptrs_dev = [K codes][V codes][K out][V out] x n.
  absl::Status DequantizeOnH2d(void** ptrs_dev, uint32_t n);
  // A T2 scratch area (codes, pointer arrays) handed out as a ring, one event per batch.
  struct Scratch {
    explicit Scratch(uint32_t capacity) : ring(capacity) {}
    uint8_t* codes = nullptr;    // capacity * CompressedBlockBytes(), device
    void** ptrs_dev = nullptr;   // 4 * capacity device pointers
    void** ptrs_host = nullptr;  // pinned mirror
    ScratchRing ring;
    std::vector<std::pair<uint64_t, cudaEvent_t>> batches;  // in flight: id, its event
    std::vector<cudaEvent_t> spare;
    uint64_t next_id = 0;
  };
  // Entries for n blocks of `s` (a wait only when the ring wraps onto a batch still in flight):
  // the codes and both pointer arrays, and the event to record once their last use is issued.
  struct ScratchBatch {
    uint8_t* codes;
    void** ptrs_host;
    void** ptrs_dev;
    cudaEvent_t done;
  };
  absl::StatusOr<ScratchBatch> TakeScratch(Scratch& s, uint32_t n);
  void FreeScratch(Scratch& s);

  LayerStagerOptions options_;
  ArenaBuffers device_{options_.arena};  // destroyed after the destructor drained the streams
  PinnedMapping* t1_;
  PinnedMapping* t2_;
  StagingPlanner planner_;
  std::vector<Slot> slots_;
  StagingPlanner resident_planner_ = *StagingPlanner::Create(1, 1);
  std::vector<Slot> resident_slots_;  // one per layer; empty = no resident area
  uint32_t resident_entries_ = 0;
  cudaStream_t h2d_ = nullptr;
  cudaStream_t d2h_ = nullptr;
  cudaEvent_t produced_ = nullptr;
  cudaEvent_t offloaded_ = nullptr;
  // Compressed offload and restore scratch; restored_ marks the last restore.
  Scratch offload_{options_.max_offload_batch};
  Scratch restore_{options_.max_offload_batch};
  cudaEvent_t restored_ = nullptr;
  uint64_t scratch_host_waits_ = 0;
  CopyIssuer h2d_issuer_;
  CopyIssuer d2h_issuer_;
  std::vector<CopyRun> runs_;
  uint64_t h2d_bytes_ = 0;
  uint64_t d2h_bytes_ = 0;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_LAYER_STAGER_H_
