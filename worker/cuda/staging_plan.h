#ifndef KVTIER_WORKER_CUDA_STAGING_PLAN_H_
#define KVTIER_WORKER_CUDA_STAGING_PLAN_H_

// Host-side bookkeeping of the GPU staging area, with no CUDA in it (unit-tested on any machine).
//
// Before layer l's attention, the T1 (and T2) pages of layer l must be on the device. They go
// into staging slot l % num_slots (2 slots = double-buffered: layer l+1 is copied while layer l
// computes). A slot holds up to `entries_per_slot` page blocks of one layer. The planner is
// differential: a page already staged in the slot for the same layer, with the same version, is
// not copied again; only missing or changed pages produce copies. A slot that last held another
// layer is entirely stale. With num_slots == num_layers a page is copied once per change; with 2
// slots every step re-copies (the PCIe-bound regime the cost model describes).

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvtier::worker::cuda {

enum class StageSource : uint8_t {
  kFull = 0,        // T1: full-precision block, copied as is
  kCompressed = 1,  // T2: codes + scales, copied then dequantized into the entry
};

// One page the layer's attention needs from host memory.
struct StageRequest {
  uint64_t page_id = 0;     // caller's stable id (e.g. sequence << 32 | page index)
  uint64_t version = 0;     // bumps whenever the page's host content changes
  uint64_t src_offset = 0;  // byte offset of this layer's block in the host pool
  uint64_t src_bytes = 0;   // bytes to copy (full block, or the compressed block)
  StageSource source = StageSource::kFull;
};

// One host-to-device copy: pool bytes [src_offset, +bytes) to staging entry `entry`.
struct StageCopy {
  uint32_t request = 0;  // index into the Plan() input
  uint32_t entry = 0;
  uint64_t src_offset = 0;
  uint64_t bytes = 0;
  StageSource source = StageSource::kFull;
};

struct LayerStagePlan {
  uint32_t slot = 0;
  std::vector<uint32_t> entry_of_request;  // staging entry of each request, in input order
  std::vector<StageCopy> copies;           // only what is missing or changed
  uint32_t reused = 0;                     // requests served without a copy
};

// Not thread-safe: the decode loop that issues prefetches owns it.
class StagingPlanner {
 public:
  // INVALID_ARGUMENT when a count is zero.
  static absl::StatusOr<StagingPlanner> Create(uint32_t num_slots, uint32_t entries_per_slot);

  // Plans layer `layer`'s staging. INVALID_ARGUMENT on duplicate page ids or zero bytes;
  // RESOURCE_EXHAUSTED when the requests exceed entries_per_slot (nothing changes then).
  // Free entries are handed out lowest first to the pages to copy in source order (full blocks
  // by source offset, then compressed ones), and `copies` lists them so: a fresh plan is
  // contiguous in staging, and pages evenly spaced in the pool become one run or one pitched
  // copy (GroupStrided), whatever order the requests name them in.
  absl::StatusOr<LayerStagePlan> Plan(uint32_t layer, absl::Span<const StageRequest> requests);

  // Forgets a page everywhere (its host copy is gone or changed without a version bump).
  void Invalidate(uint64_t page_id);

  uint32_t num_slots() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t entries_per_slot() const { return entries_per_slot_; }
  uint32_t SlotOfLayer(uint32_t layer) const { return layer % num_slots(); }

 private:
  struct Staged {
    uint32_t entry;
    uint64_t version;
  };
  struct Slot {
    int64_t layer = -1;  // layer whose blocks the entries hold; -1 = none
    absl::flat_hash_map<uint64_t, Staged> pages;
  };
  StagingPlanner(uint32_t num_slots, uint32_t entries_per_slot)
      : entries_per_slot_(entries_per_slot), slots_(num_slots) {}

  uint32_t entries_per_slot_;
  std::vector<Slot> slots_;
};

// A contiguous copy after merging: host [src_offset, +bytes) -> staging [dst_offset, +bytes).
struct CopyRun {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

// Turns a plan's full-precision copies into byte runs (dst = entry * entry_bytes), merging
// neighbours that are contiguous on both sides, and cutting runs at multiples of
// `src_split_bytes` (the pinned chunks: a DMA never spans two registrations; 0 = no cut).
// Compressed copies are left out (they take the dequantizing path).
std::vector<CopyRun> CoalesceFullCopies(absl::Span<const StageCopy> copies, uint64_t entry_bytes,
                                        uint64_t src_split_bytes);

// Merges and cuts arbitrary runs the same way (used for offloads too). Input order is kept.
std::vector<CopyRun> CoalesceRuns(absl::Span<const CopyRun> runs, uint64_t src_split_bytes);

// Most bytes between the starts of two rows of a pitched copy (the devices'
// cudaDevAttrMaxPitch, 2^31 - 1 on current GPUs).
inline constexpr uint64_t kMaxCopyPitch = (uint64_t{1} << 31) - 1;

// `rows` copies of `bytes`: row i from src_offset + i * src_pitch to dst_offset + i * dst_pitch.
// One row is a plain run; more are one pitched DMA (cudaMemcpy2DAsync), one descriptor.
struct StridedRun {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;  // of each row
  uint64_t rows = 1;
  uint64_t src_pitch = 0;  // >= bytes when rows > 1
  uint64_t dst_pitch = 0;
};

// Groups consecutive runs of one size whose sources and destinations advance by constant pitches
// (each at least the size and at most kMaxCopyPitch) into strided runs; a group never spans a
// multiple of `src_split_bytes` on the source side (0 = no cut). Input order is kept: the rows of
// a group are consecutive input runs. With the store's layout (a T1 slot = one page of every
// layer) one layer's blocks of pages in consecutive slots are page_bytes apart: one strided run.
std::vector<StridedRun> GroupStrided(absl::Span<const CopyRun> runs, uint64_t src_split_bytes);

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_STAGING_PLAN_H_
