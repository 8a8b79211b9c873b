#ifndef KVTIER_WORKER_TIERED_KV_STORE_H_
#define KVTIER_WORKER_TIERED_KV_STORE_H_

// The tiered KV store of ONE sequence: an AttentionCache whose pages live in T0 (device arena),
// T1 (DDR pool slot), T2 (compressed pool slot) or T3 (evicted), moved by plans.
//
// Page layout (core/layout/geometry.h): a page holds page_tokens positions of one layer group;
// for each layer of the group, K then V, each [page_tokens][num_kv_heads][head_dim] f32 (bf16 on
// the CUDA backend when asked). T0 and T1 hold that layout verbatim (T1 slot =
// KvGeometry::PageBytes(group) bytes); T2 holds, per layer, the codec's encoding of K then V, each
// block reserved for page_tokens rows and 16-byte aligned (CompressedSlotBytes).
//
// Zero-error property: attention reads T0 and T1 pages (in place on the host backend, staged on
// a device) through the same kernel in position order, so with no T2/T3 page the output and
// position_mass are bit-identical whatever the T0/T1 split.
//
// Every decision lives here, for every backend: validation, plan order, slot bookkeeping,
// versions, stats, in-place lists and released slots. The backend (worker/kv_backend.h) only
// moves bytes and runs kernels. Its copies may land after the call that issued them: a T0 block
// a copy reads returns to the arena, and a source slot is reported released, only after that
// copy completed (FencedReleases).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/layout/geometry.h"
#include "core/tiering/types.h"
#include "worker/attention_cache.h"
#include "worker/codecs/codec.h"
#include "worker/device_arena.h"
#include "worker/fenced_releases.h"
#include "worker/kv_backend.h"
#include "worker/page_pool.h"

namespace kvtier::worker {

struct TieredKvStoreOptions {
  // element_bytes: 4 (f32, every backend) or 2 (bf16, the CUDA backend: rows are given as f32
  // and stored rounded to nearest even).
  layout::KvGeometry geometry;
  uint32_t num_q_heads = 0;         // multiple of geometry.num_kv_heads
  float scale = 0.f;                // 0 = 1/sqrt(head_dim)
  std::string codec = "int8_kivi";  // T2 codec: see codecs::FindCodec
  // Per-(layer, kv_head) keep mask (per-head eviction baselines such as H2O): SetKeep works
  // only when enabled; masked positions are skipped by attention and get mass 0.
  bool keep_mask = false;
  // Dequantized T2 pages kept between Attend calls (differential staging); 0 = no limit.
  uint32_t max_staged_pages = 0;
  // Force the portable kernel (tests); otherwise the best ISA of this CPU.
  bool portable_kernel = false;
};

// Where the store's tiers live. Not owned; must outlive the store.
struct StoreMemory {
  DeviceArena* arena = nullptr;         // T0, required; host-accessible iff the backend's host_t0
  PagePool* ddr_pool = nullptr;         // T1; null = moves to T1 are rejected
  PagePool* compressed_pool = nullptr;  // T2; null = moves to T2 are rejected
};

// Destination slot of one move, parallel to the plan's moves. Read only for moves to T1
// (offset in the DDR pool) and T2 (offset in the compressed pool).
struct SlotAssignment {
  uint64_t dst_offset = 0;
  friend bool operator==(const SlotAssignment&, const SlotAssignment&) = default;
};

// Cumulative counters of one store.
struct StoreStats {
  // [from][to] tier, by tiering::Tier value. bytes = bytes written at the destination (the
  // encoded size for moves into T2, 0 for evictions).
  uint64_t move_bytes[tiering::kNumTiers][tiering::kNumTiers] = {};
  uint64_t move_count[tiering::kNumTiers][tiering::kNumTiers] = {};
  uint64_t plans_applied = 0;
  uint64_t plans_rejected = 0;
  uint64_t apply_nanos = 0;            // time spent executing moves
  uint64_t t2_layers_dequantized = 0;  // (page, layer) blocks decoded into staging
  uint64_t t2_layers_reused = 0;       // (page, layer) blocks found already staged
  uint64_t attend_nanos = 0;           // time in Attend (staging + kernel)
  uint64_t split_attends = 0;          // Attend calls merged from two partials
  // Host-to-device bytes copied into staging for attention, the next layer's prefetch included
  // (device backends; 0 on the host backend, which reads T1 in place).
  uint64_t staged_h2d_bytes = 0;
  // Of those, bytes copied into the resident area a schedule keeps across steps (device
  // backends: a resident page is copied once per change).
  uint64_t resident_h2d_bytes = 0;
  // The copy calls that staging issued, the descriptors they carried, and the calls that went
  // through the batch API (device backends; a batch refused by the driver falls back for good).
  uint64_t staged_copy_calls = 0;
  uint64_t staged_copy_descriptors = 0;
  uint64_t staged_batched_calls = 0;
};

// The scale attention uses: options.scale, or 1/sqrt(head_dim) when it is 0.
float AttentionScale(const TieredKvStoreOptions& options);
// Full-precision slot bytes of group g (what the worker tells the daemon for T1).
uint64_t DdrSlotBytes(const layout::KvGeometry& geometry, uint32_t group);
// Compressed slot bytes of group g under `codec` (T2).
uint64_t CompressedSlotBytes(const codecs::Codec& codec, const layout::KvGeometry& geometry,
                             uint32_t group);

// Not thread-safe: one decode loop drives a store. Several stores may share the arena and the
// pools (those are thread-safe), and each store only touches slots it was granted.
class TieredKvStore final : public AttentionCache {
 public:
  // Over the host backend. INVALID_ARGUMENT naming the field for a bad geometry / head count /
  // codec / memory.
  static absl::StatusOr<std::unique_ptr<TieredKvStore>> Create(const TieredKvStoreOptions& options,
                                                               const StoreMemory& memory);
  // Over `backend` (built for the same options). INVALID_ARGUMENT also when the arena's host
  // accessibility differs from the backend's, or for keep_mask on a device backend.
  static absl::StatusOr<std::unique_ptr<TieredKvStore>> Create(const TieredKvStoreOptions& options,
                                                               const StoreMemory& memory,
                                                               std::unique_ptr<KvBackend> backend);
  // Waits for the backend's copies, then frees the store's T0 blocks. Pool slots are NOT freed:
  // see HeldSlots.
  ~TieredKvStore() override;
  TieredKvStore(const TieredKvStore&) = delete;
  TieredKvStore& operator=(const TieredKvStore&) = delete;

  // --- AttentionCache. New pages are allocated in T0 (RESOURCE_EXHAUSTED when the arena is
  // full). Appending into a T1 page writes its slot in place (host backend only: on a device
  // the page being written stays in T0); a T2 or T3 page cannot grow (FAILED_PRECONDITION). On
  // error nothing is stored. Pointers are the backend's: host memory on the host backend,
  // device memory on a device. On a backend with device_scores, position_mass must be null
  // (the backend accumulates the cumulative score: TakeScores).
  uint32_t Length(uint32_t layer) const override;
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override;
  // The same from K and V rows laid out as their strides say (RowStrides: transformers'
  // [kv_heads][n][head_dim] views are read where they lie); UNIMPLEMENTED on a device backend
  // for any but dense rows.
  absl::Status Append(uint32_t layer, const float* k, RowStrides k_strides, const float* v,
                      RowStrides v_strides, uint32_t n);
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override;
  // The same with a sliding window and/or a softcap (AttendMask), and queries laid out as
  // q_strides say (out stays dense); UNIMPLEMENTED on a device backend when either is set or
  // the queries are not dense.
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out, float* position_mass,
                      const AttendMask& mask, RowStrides q_strides = {});
  void SetTaskRunner(kernels::TaskRunner* runner) override { backend_->SetTaskRunner(runner); }
  // One decode query of `layer` per store (its last position), attended in one batch: on a
  // device backend one kernel for all of them, elsewhere one after the other, the same results
  // as one Attend(layer, q_i, 1, out_i, mass_i) per store. q and out are [stores.size()]
  // [q_heads][head_dim] (the backends' memory); position_mass is empty or one pointer per store
  // (null allowed; must be empty or all null on a device_scores backend). INVALID_ARGUMENT
  // naming stores[i] (and changing nothing) for an empty or null list, a store listed twice,
  // stores of another geometry, query-head count or backend kind than stores[0], a layer out of
  // range or with no cached position, or a position_mass of another size.
  static absl::Status AttendBatch(const std::vector<TieredKvStore*>& stores, uint32_t layer,
                                  const float* q, float* out,
                                  const std::vector<float*>& position_mass = {});

  // --- Plans. Applies `moves` in order; slots[i] is the destination of moves[i]. The whole plan
  // is validated before any data moves; on error nothing changed. INVALID_ARGUMENT naming the
  // field for: slots.size() != moves.size(), unknown group/page, duplicate page, `from` not the
  // page's tier, from == to, a T3 source, a destination tier without a pool, a slot offset
  // misaligned, out of the pool or overlapping a slot in use or another destination, moving the
  // partial page being written to T2/T3 (on a device backend: out of T0 at all).
  // FAILED_PRECONDITION when layers differ in length (plans apply between forward passes).
  // RESOURCE_EXHAUSTED when promotions would overflow the arena at any point of the plan's
  // order. Nothing is issued to the backend before the whole plan passed. ApplyPlan returns
  // only once the copies reading the source slots it gives up have landed (the daemon may hand
  // them out as soon as it has the ack); `released` (optional) receives those slots. T0 blocks
  // given up are recycled when their copies complete, without a wait. Only if an arena shared with
  // other sequences fills up between validation and a promotion does a plan stop part-way
  // (RESOURCE_EXHAUSTED naming the move): the moves before it are applied, every page still has
  // exactly one valid copy.
  absl::Status ApplyPlan(const std::vector<tiering::Move>& moves,
                         const std::vector<SlotAssignment>& slots,
                         std::vector<ReleasedSlot>* released = nullptr);
  // --- Rollback. Forgets every position at or after `length` in every layer (speculative
  // decoding, a crop): pages past the new end are dropped whatever their tier (their slots go
  // into `released`, for whoever granted them), and the page that keeps some rows must be one
  // appends can write (T0, or T1 on a host backend). Split attention ends. INVALID_ARGUMENT
  // when `length` exceeds the layers' length; FAILED_PRECONDITION (changing nothing) when
  // layers differ in length or the kept partial page is not writable (name, tier: promote it
  // first, or evicted: the rows it keeps are gone).
  absl::Status Truncate(uint32_t length, std::vector<ReleasedSlot>* released);

  // Points the store at other pools (a new daemon session's memory). FAILED_PRECONDITION while
  // any page lives in T1 or T2: promote them first.
  absl::Status RebindPools(PagePool* ddr_pool, PagePool* compressed_pool);
  // Local mode: takes destination slots from `source`, applies, and frees released slots there
  // (and the new slots again when the plan is rejected).
  absl::Status ApplyPlanLocal(const std::vector<tiering::Move>& moves, SlotSource& source);

  // --- Split attention (prefetch schedules, docs/scheduling.md). in_place[g] lists the pages
  // of group g that a schedule leaves in host memory: a decode step (one query) attends them as
  // a second partial, merged by log-sum-exp with the partial over every other page — exact up
  // to the rounding of one merge (worker/kernels/attention_merge.h). INVALID_ARGUMENT naming
  // the group and page, changing nothing, for a page that does not exist, is not in T1/T2 or
  // is listed twice, or for other than layer_groups lists; an empty vector ends split
  // attention. A page that leaves T1/T2 later is attended with the rest.
  absl::Status SetInPlacePages(const std::vector<std::vector<uint32_t>>& in_place);
  // The whole schedule: resident, stage and in-place pages (each checked as above, a page in at
  // most one list) and the budgets, handed to the backend (a device follows them: resident pages
  // stay staged across steps, stage pages are copied in order within h2d_bytes_per_step, in-place
  // pages are attended by the CPU). A refusal by the store or the backend changes nothing; an
  // empty schedule ends the one in force.
  absl::Status SetSchedule(const StageSchedule& schedule);
  uint64_t in_place_pages() const;  // pages now named in place

  // --- Inspection.
  const layout::KvGeometry& geometry() const { return geometry_; }
  const codecs::Codec& codec() const { return *codec_; }
  // Pages of the longest layer (all groups have this many page entries).
  uint32_t num_pages() const;
  tiering::Tier TierOf(uint32_t group, uint32_t page) const;
  tiering::Placement placement() const;
  // True when the page's values went through T2 (they carry 8-bit error).
  bool IsLossy(uint32_t group, uint32_t page) const;
  // Slot bytes this store needs in `kind` for group g.
  uint64_t SlotBytes(PoolKind kind, uint32_t group) const;
  // Slots this store holds now (T1 and T2 pages): what CloseSequence must free.
  std::vector<ReleasedSlot> HeldSlots() const;
  // Full-precision view of a page (dequantized for T2, bf16 widened): DdrSlotBytes /
  // element_bytes floats into dst (host memory, on every backend). FAILED_PRECONDITION for an
  // evicted page, INVALID_ARGUMENT for an unknown one.
  absl::Status ReadPage(uint32_t group, uint32_t page, float* dst) const;
  const StoreStats& stats() const { return stats_; }
  const KvBackend& backend() const { return *backend_; }
  // device_scores backends: the score each position of each group gained since the last call
  // ([group][position < Length(0)]); the device copy restarts from zero. FAILED_PRECONDITION
  // on a backend that keeps none (the host: scores come through Attend's position_mass).
  absl::StatusOr<std::vector<std::vector<float>>> TakeDeviceScores();

  // Per-head mask (options.keep_mask): position of `layer`'s `kv_head` kept or masked.
  absl::Status SetKeep(uint32_t layer, uint32_t kv_head, uint32_t position, bool keep);

 private:
  using PageEntry = StoredPage;

  TieredKvStore(const TieredKvStoreOptions& options, const StoreMemory& memory,
                const codecs::Codec* codec, std::unique_ptr<KvBackend> backend);

  // Full-precision bytes of a T0/T1 page (backend memory for T0, host memory for T1), or null.
  uint8_t* PageBytes(uint32_t group, uint32_t page) const;
  absl::Status EnsurePages(uint32_t group, uint64_t pages);
  // A T0 block: recycles fenced blocks whose copies completed first, and waits for the rest
  // before giving up on a full arena.
  absl::StatusOr<uint8_t*> AllocateBlock(uint64_t bytes);
  void FreeBlock(uint8_t* block, uint64_t bytes) { memory_.arena->Free(block, bytes); }
  void PollFence();
  absl::Status ValidatePlan(const std::vector<tiering::Move>& moves,
                            const std::vector<SlotAssignment>& slots) const;
  // Source tier, destination tier and pool checks of moves[i].
  absl::Status ValidateMoveTiers(const tiering::Move& m, size_t i, uint32_t pages,
                                 bool partial_tail) const;
  absl::Status ValidateSlots(const std::vector<tiering::Move>& moves,
                             const std::vector<SlotAssignment>& slots) const;
  // Fails (changing nothing for this move) only when the arena refuses a promotion.
  absl::Status ExecuteMove(const tiering::Move& move, const SlotAssignment& slot,
                           std::vector<ReleasedSlot>* released);
  PagePool* PoolOf(tiering::Tier tier) const;
  uint32_t ValidRows(uint32_t group, uint32_t page) const;
  // The page is named in place and still lives in host memory (T1/T2).
  bool InPlaceNow(uint32_t group, uint32_t page) const;
  // The layer's decode-step positions have a live in-place page (split attention applies).
  bool SplitsAt(uint32_t group, uint32_t length) const;
  // Validates an Attend and fills its call (keep_rows_ must outlive the call).
  absl::Status PrepareAttend(uint32_t layer, const float* q, uint32_t n, float* out,
                             float* position_mass, AttendCall* call);

  layout::KvGeometry geometry_;
  uint32_t num_q_heads_;
  bool keep_mask_;
  StoreMemory memory_;
  const codecs::Codec* codec_;
  KvLayout layout_;
  std::unique_ptr<KvBackend> backend_;
  FencedReleases fence_;
  uint64_t row_floats_;                        // num_kv_heads * head_dim
  std::vector<uint32_t> lengths_;              // per layer
  std::vector<std::vector<PageEntry>> pages_;  // [group][page]
  std::vector<std::vector<uint8_t>> keep_;     // [layer * kv_heads + h][position]
  // Slots held now, per pool (0 = DDR, 1 = compressed): offset -> end. Kept in step with the
  // page table so validating a plan's destinations costs O(moves log pages).
  absl::btree_map<uint64_t, uint64_t> held_[2];
  // Split attention: [group][page] 1 = in place (empty = none).
  std::vector<std::vector<uint8_t>> in_place_;
  std::vector<const uint8_t*> keep_rows_;  // per-Attend, kept to avoid reallocation
  // First version of a new page: above every version a dropped page had, so a page index that
  // comes back after Truncate never matches what a backend staged for the old one.
  uint64_t new_page_version_ = 0;
  StoreStats stats_;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_TIERED_KV_STORE_H_
