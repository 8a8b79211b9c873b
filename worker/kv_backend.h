#ifndef KVTIER_WORKER_KV_BACKEND_H_
#define KVTIER_WORKER_KV_BACKEND_H_

// The seam between the tiered store's logic (TieredKvStore: validation, plan order, slot
// bookkeeping, versions, stats, in-place lists, released slots) and where the bytes live. A
// backend only moves data and runs kernels; it never decides anything. Two implement it: the
// host backend (T0 in host memory, worker/host_kv_backend.h) and the CUDA backend (T0 in HBM,
// worker/cuda/cuda_kv_backend.h, built only with the toolkit).
//
// Copies may complete after the call that issued them returns (CUDA copy streams). Each issuing
// call leaves a completion token behind (LastToken); the store keeps what a copy still reads
// (a T0 block, a source slot) until Completed(token) says it landed (FencedReleases).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/layout/geometry.h"
#include "core/tiering/types.h"
#include "worker/codecs/codec.h"
#include "worker/fenced_releases.h"

namespace kvtier::worker {

namespace kernels {
class TaskRunner;
}
struct StoreStats;
class PagePool;

// One page of one layer group as the store's page table holds it.
struct StoredPage {
  tiering::Tier tier = tiering::Tier::kT0;
  uint8_t* t0 = nullptr;  // T0 block (backend memory)
  uint64_t slot = 0;      // T1 / T2 slot offset in its pool
  uint32_t compressed_rows = 0;
  bool lossy = false;
  uint64_t version = 0;  // bumps on every change of the page's bytes or place
};

// A page a schedule names in place and that still lives in host memory: attended there, as a
// second partial (split attention).
inline bool AttendedInPlace(const StoredPage& page, uint8_t in_place_mark) {
  return in_place_mark != 0 && (page.tier == tiering::Tier::kT1 || page.tier == tiering::Tier::kT2);
}

// A prefetch schedule as the store hands it to its backend (TieredKvStore::SetSchedule;
// docs/scheduling.md): per layer group, pages of T1/T2 kept staged next to the device across
// steps (resident), pages copied before the group's attention in the order given (stage), and
// pages attended where they live (in_place, also the store's in-place marks). Every listed page
// exists, lives in T1/T2 and is listed once. No groups = no schedule.
struct StageSchedule {
  std::vector<std::vector<uint32_t>> resident, stage, in_place;  // [group] each
  uint64_t staging_bytes = 0;       // the sequence's share of the device's staging area
  uint64_t h2d_bytes_per_step = 0;  // the sequence's host-to-device bytes per decode step
  bool empty() const { return resident.empty() && stage.empty() && in_place.empty(); }
};

// Byte layout of pages (shared by the store and every backend). A page of group g holds, for
// each layer of g, K then V, each [page_tokens][num_kv_heads][head_dim] elements of
// geometry.element_bytes (4 = f32 on every backend, 2 = bf16 where the backend stores it,
// StoresElementBytes); the *Floats helpers count elements, the *Bytes ones bytes. A compressed page
// holds, per layer, the codec's encoding of K then V, each block reserved for page_tokens rows
// and 16-byte aligned.
struct KvLayout {
  layout::KvGeometry geometry;
  const codecs::Codec* codec = nullptr;

  uint64_t RowFloats() const { return geometry.ValuesPerTokenLayer(); }
  // Floats of one layer's block (K and V) and offset of layer `l` of the group inside a page.
  uint64_t LayerBlockFloats() const { return 2 * uint64_t{geometry.page_tokens} * RowFloats(); }
  uint64_t LayerOffsetFloats(uint32_t layer_in_group) const {
    return uint64_t{layer_in_group} * LayerBlockFloats();
  }
  uint64_t RowBytes() const { return RowFloats() * geometry.element_bytes; }
  uint64_t LayerBlockBytes() const { return LayerBlockFloats() * geometry.element_bytes; }
  uint64_t LayerOffsetBytes(uint32_t layer_in_group) const {
    return LayerOffsetFloats(layer_in_group) * geometry.element_bytes;
  }
  // Reserved bytes of one encoded K or V block.
  uint64_t ReservedBlockBytes(codecs::TensorRole role) const;
  uint64_t CompressedBlockOffset(uint32_t layer_in_group, codecs::TensorRole role) const;
  uint64_t CompressedSlotBytes(uint32_t group) const;
};

// What a model's layer restricts its attention by, beyond causality (kernels::AttentionParams'
// window and softcap; 0 = none). The host backend computes both; a device refuses them.
struct AttendMask {
  uint32_t window = 0;
  float softcap = 0.f;
};

// Where the rows of n tokens (queries, or K / V to append) live: token t's head h starts
// t * token + h * head floats past the base pointer, its head_dim values contiguous. {0, 0} is
// dense, [n][heads][head_dim]. Another layout, such as transformers' [heads][n][head_dim] views,
// is read where it lies on the host backend (no copy); a device takes dense rows only.
struct RowStrides {
  uint64_t token = 0;
  uint64_t head = 0;

  bool dense() const { return token == 0 && head == 0; }
};

// One Attend of one layer over the pages covering [0, length).
struct AttendCall {
  uint32_t layer = 0;
  uint32_t group = 0;
  const float* q = nullptr;        // [n][q_heads][head_dim], or as q_strides say
  RowStrides q_strides;            // dense unless set (host backend only)
  uint32_t n = 0;                  // queries: the last n positions (causal)
  float* out = nullptr;            // [n][q_heads][head_dim]
  float* position_mass = nullptr;  // [length] or null
  uint32_t length = 0;
  const StoredPage* pages = nullptr;         // the group's page table, at least NumPages(length)
  const uint8_t* in_place = nullptr;         // [in_place_pages] marks (AttendedInPlace), or null
  uint32_t in_place_pages = 0;               // pages past it are not marked
  bool split = false;                        // some page of [0, length) is attended in place
  const uint8_t* const* keep = nullptr;      // per kv head [length] keep masks, or null
  const uint8_t* ddr_base = nullptr;         // host memory of the T1 pool (null: none)
  const uint8_t* compressed_base = nullptr;  // host memory of the T2 pool (null: none)
  AttendMask mask;                           // sliding window and softcap of the layer

  uint8_t InPlaceMark(uint32_t page) const { return page < in_place_pages ? in_place[page] : 0; }
};

// Not thread-safe: owned by one store and driven by its decode loop.
class KvBackend {
 public:
  virtual ~KvBackend() = default;

  // True when T0 blocks are host memory (the host backend). Otherwise (a device) appends write
  // only T0 pages: the page being written stays in T0.
  virtual bool host_t0() const = 0;
  // The store's pools, at creation and at every RebindPools (either may be null). A device
  // registers them for DMA.
  virtual absl::Status BindPools(PagePool* ddr, PagePool* compressed) {
    (void)ddr;
    (void)compressed;
    return absl::OkStatus();
  }
  // True when the backend accumulates the cumulative score itself (TakeScores), so Attend's
  // position_mass stays null.
  virtual bool device_scores() const { return false; }
  // Whether pages may hold elements of this many bytes (4 = f32 everywhere; 2 = bf16 on a
  // device that stores it).
  virtual bool StoresElementBytes(uint32_t element_bytes) const { return element_bytes == 4; }

  // A fresh T0 block reads as zeros.
  virtual absl::Status ClearBlock(uint8_t* block, uint64_t bytes) = 0;
  // Writes `rows` K rows to k_dst and V rows to v_dst (row_floats values each, stored in the
  // layout's element type), from the engine's f32 k / v (host memory on the host backend,
  // device memory on a device).
  virtual absl::Status WriteRows(uint8_t* k_dst, uint8_t* v_dst, const float* k, const float* v,
                                 uint32_t rows, uint64_t row_floats) = 0;
  // The same from K and V rows laid out as their strides say (RowStrides, not dense): `rows`
  // tokens of `heads` heads of head_dim values each. Host backend only.
  virtual absl::Status WriteStridedRows(uint8_t* /*k_dst*/, uint8_t* /*v_dst*/, const float* /*k*/,
                                        RowStrides /*k_strides*/, const float* /*v*/,
                                        RowStrides /*v_strides*/, uint32_t /*rows*/,
                                        uint32_t /*heads*/, uint32_t /*head_dim*/) {
    return absl::UnimplementedError("strided K/V rows are read by the host backend only");
  }
  // Full-precision page copy between T0 (a block) and T1 (host memory of the DDR pool).
  virtual absl::Status CopyPage(tiering::Tier from, const uint8_t* src, tiering::Tier to,
                                uint8_t* dst, uint64_t bytes) = 0;
  // Encodes a T0 or T1 page of `group` (its first `rows` rows) into compressed slot memory.
  virtual absl::Status EncodePage(tiering::Tier from, const uint8_t* src, uint32_t group,
                                  uint32_t rows, uint8_t* dst) = 0;
  // Decodes a compressed page into a T0 block or a T1 slot (rows past `rows` read as zeros).
  virtual absl::Status DecodePage(const uint8_t* src, uint32_t group, uint32_t rows,
                                  tiering::Tier to, uint8_t* dst) = 0;
  // Copies a page (any tier but T3) to host memory `dst` as f32 (bf16 widened exactly), when it
  // returns.
  virtual absl::Status ReadPage(const StoredPage& page, uint32_t group, const uint8_t* ddr_base,
                                const uint8_t* compressed_base, float* dst) = 0;

  // Token of everything issued so far on the store's behalf, including work queued that may
  // still read a block (kNoCopyPending when nothing is outstanding).
  virtual CopyToken LastToken() = 0;
  virtual bool Completed(CopyToken token) = 0;
  // Blocks the host until `token` completed.
  virtual absl::Status Wait(CopyToken token) = 0;
  // Blocks the host until nothing issued reads or writes the store's memory (destruction).
  virtual absl::Status Drain() { return Wait(LastToken()); }

  // The page left its tier or changed: drop what was staged of it.
  virtual void Forget(uint32_t group, uint32_t page) = 0;
  // Follows `schedule` (checked by the store; empty ends it) over the store's page tables
  // [group][page]. A refusal (INVALID_ARGUMENT naming the field, value and limit) issues nothing
  // and leaves the schedule in force unchanged. The host backend reads every host page where it
  // lives, so the store's in-place marks are all it needs.
  virtual absl::Status FollowSchedule(const StageSchedule& schedule,
                                      const std::vector<std::vector<StoredPage>>& pages) {
    (void)schedule;
    (void)pages;
    return absl::OkStatus();
  }
  // Attention of one layer; updates the staging counters of `stats`.
  virtual absl::Status Attend(const AttendCall& call, StoreStats& stats) = 0;
  // Attention of one layer for several stores at once (TieredKvStore::AttendBatch): calls[i]
  // is store i's call, run by backends[i] (this one is backends[0]) with stats[i]. The queries
  // of the calls are consecutive rows of one buffer: calls[i].q (and .out) is calls[0].q plus
  // the rows of the calls before it. A device backend runs one kernel over all of them; this
  // default attends one call after the other, which gives the same results (a query's attention
  // never depends on the others of a batch).
  virtual absl::Status AttendBatch(const std::vector<KvBackend*>& backends,
                                   const std::vector<AttendCall>& calls,
                                   const std::vector<StoreStats*>& stats) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (absl::Status s = backends[i]->Attend(calls[i], *stats[i]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  virtual void SetTaskRunner(kernels::TaskRunner* runner) { (void)runner; }
  // device_scores() only: scores[g] receives, for positions [0, length) of group g, the score
  // gained since the last call (the device copy restarts from zero). Once per re-tiering.
  virtual absl::Status TakeScores(uint32_t length, std::vector<std::vector<float>>* scores) {
    (void)length;
    (void)scores;
    return absl::UnimplementedError("this backend keeps no scores");
  }
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_KV_BACKEND_H_
