#ifndef KVTIER_WORKER_CUDA_CUDA_KV_BACKEND_H_
#define KVTIER_WORKER_CUDA_CUDA_KV_BACKEND_H_

// The CUDA backend of the tiered store (worker/kv_backend.h). T0 is a CudaDeviceArena in HBM;
// T1 and T2 are the worker's pool memory, registered for DMA chunk by chunk (PinnedMapping,
// one registration per pool for every store of the worker). Per store, a LayerStager moves
// pages: demotions on its device-to-host stream (T2: quantized on the GPU first), promotions
// on its host-to-device stream (T2: dequantized on the GPU), and, before each layer's
// attention, the layer's T1/T2 pages into a staging slot, the next layer's one layer ahead.
// Attention is the paged decode kernel over T0 blocks and staged blocks through one page table
// (bit-identical whatever the T0/T1 split); its position mass goes into a device buffer of
// cumulative scores by the paper's rule (AccumulateScores), read by the host once per
// re-tiering. Moves between two host tiers (T1 <-> T2) run the CPU codecs (the same bytes) after
// the copy streams drained.
//
// The engine's pointers (Append's k, v; Attend's q, out) are device memory; everything on the
// token path is enqueued on the engine's stream and never synchronizes the host, except to
// reuse a pinned page-table buffer last used a whole forward pass ago.

#include <memory>

#include "absl/status/statusor.h"
#include "core/layout/geometry.h"
#include "worker/codecs/codec.h"
#include "worker/store_backends.h"

namespace kvtier::worker::cuda {

// FAILED_PRECONDITION "no CUDA device: <error>" without a usable device; the CUDA error of the
// arena's allocation otherwise. `stream` is a cudaStream_t (null = the default stream).
absl::StatusOr<std::unique_ptr<StoreBackends>> MakeCudaStoreBackends(uint64_t arena_bytes,
                                                                     void* stream);

// The working memory of one CUDA store (docs/cuda.md, "The HBM budget"): its staging slots,
// resident area, T2 scratch, page tables, attention workspace, split partials and scores come
// from the device arena with its T0 pages, so arena_bytes (the HBM budget the worker reports)
// must hold the T0 pages plus StoreWorkingBytes per store.
struct StoreWorkingShape {
  layout::KvGeometry geometry;
  uint32_t num_q_heads = 0;
  uint64_t max_tokens = 0;      // longest sequence
  uint64_t staged_pages = 0;    // most T1/T2 pages one layer stages
  uint64_t resident_pages = 0;  // most pages a schedule keeps resident per layer (0: none)
  // Stores attending in one launch: the launching store's page tables hold the whole batch's.
  uint32_t batch = 1;
  const codecs::Codec* t2_codec = nullptr;  // null: no T2 pool
};
// An upper bound of the bytes in use, growth by doubling and the arena's alignment included.
uint64_t StoreWorkingBytes(const StoreWorkingShape& shape);

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_CUDA_KV_BACKEND_H_
