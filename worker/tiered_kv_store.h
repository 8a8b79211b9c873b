#ifndef KVTIER_WORKER_TIERED_KV_STORE_H_
#define KVTIER_WORKER_TIERED_KV_STORE_H_

// The tiered KV store of ONE sequence: an AttentionCache whose pages live in T0 (device arena),
// T1 (DDR pool slot), T2 (compressed pool slot) or T3 (evicted), moved by plans.
//
// Page layout (core/layout/geometry.h): a page holds page_tokens positions of one layer group;
// for each layer of the group, K then V, each [page_tokens][num_kv_heads][head_dim] f32. T0 and
// T1 hold that layout verbatim (T1 slot = KvGeometry::PageBytes(group) bytes); T2 holds, per
// layer, the codec's encoding of K then V, each block reserved for page_tokens rows and 16-byte
// aligned (CompressedSlotBytes).
//
// Zero-error property: attention reads T0 and T1 pages in place (CPU backend) through the same
// kernel in position order, so with no T2/T3 page the output and position_mass are
// bit-identical whatever the T0/T1 split.

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
#include "worker/kernels/attention_cpu.h"
#include "worker/page_pool.h"

namespace kvtier::worker {

struct TieredKvStoreOptions {
  // element_bytes must be 4 (f32, CPU backend).
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
  DeviceArena* arena = nullptr;         // T0, required, host-accessible on the CPU backend
  PagePool* ddr_pool = nullptr;         // T1; null = moves to T1 are rejected
  PagePool* compressed_pool = nullptr;  // T2; null = moves to T2 are rejected
};

// Destination slot of one move, parallel to the plan's moves. Read only for moves to T1
// (offset in the DDR pool) and T2 (offset in the compressed pool).
struct SlotAssignment {
  uint64_t dst_offset = 0;
  friend bool operator==(const SlotAssignment&, const SlotAssignment&) = default;
};

// A pool slot the store no longer uses. The daemon frees it after the plan is acknowledged
// (two-phase); in local mode the caller gives it back to its SlotSource.
struct ReleasedSlot {
  PoolKind kind;
  uint64_t offset;
  friend bool operator==(const ReleasedSlot&, const ReleasedSlot&) = default;
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
};

// Full-precision slot bytes of group g (what the worker tells the daemon for T1).
uint64_t DdrSlotBytes(const layout::KvGeometry& geometry, uint32_t group);
// Compressed slot bytes of group g under `codec` (T2).
uint64_t CompressedSlotBytes(const codecs::Codec& codec, const layout::KvGeometry& geometry,
                             uint32_t group);

// Not thread-safe: one decode loop drives a store. Several stores may share the arena and the
// pools (those are thread-safe), and each store only touches slots it was granted.
class TieredKvStore final : public AttentionCache {
 public:
  // INVALID_ARGUMENT naming the field for a bad geometry / head count / codec / memory.
  static absl::StatusOr<std::unique_ptr<TieredKvStore>> Create(const TieredKvStoreOptions& options,
                                                               const StoreMemory& memory);
  // Frees the store's T0 blocks. Pool slots are NOT freed: see HeldSlots.
  ~TieredKvStore() override;
  TieredKvStore(const TieredKvStore&) = delete;
  TieredKvStore& operator=(const TieredKvStore&) = delete;

  // --- AttentionCache. New pages are allocated in T0 (RESOURCE_EXHAUSTED when the arena is
  // full). Appending into a T1 page writes its slot in place; a T2 or T3 page cannot grow
  // (FAILED_PRECONDITION). On error nothing is stored.
  uint32_t Length(uint32_t layer) const override;
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override;
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override;
  void SetTaskRunner(kernels::TaskRunner* runner) override { runner_ = runner; }

  // --- Plans. Applies `moves` in order; slots[i] is the destination of moves[i]. The whole plan
  // is validated before any data moves; on error nothing changed. INVALID_ARGUMENT naming the
  // field for: slots.size() != moves.size(), unknown group/page, duplicate page, `from` not the
  // page's tier, from == to, a T3 source, a destination tier without a pool, a slot offset
  // misaligned, out of the pool or overlapping a slot in use or another destination, moving the
  // partial page being written to T2/T3. FAILED_PRECONDITION when layers differ in length (plans
  // apply between forward passes). RESOURCE_EXHAUSTED when promotions would overflow the arena
  // at any point of the plan's order. `released` (optional) receives the source slots no
  // longer used. Only if an arena shared with other sequences fills up between validation and
  // a promotion does a plan stop part-way (RESOURCE_EXHAUSTED naming the move): the moves
  // before it are applied, every page still has exactly one valid copy.
  absl::Status ApplyPlan(const std::vector<tiering::Move>& moves,
                         const std::vector<SlotAssignment>& slots,
                         std::vector<ReleasedSlot>* released = nullptr);
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
  // Full-precision view of a page (dequantized for T2): DdrSlotBytes/4 floats into dst.
  // FAILED_PRECONDITION for an evicted page, INVALID_ARGUMENT for an unknown one.
  absl::Status ReadPage(uint32_t group, uint32_t page, float* dst) const;
  const StoreStats& stats() const { return stats_; }

  // Per-head mask (options.keep_mask): position of `layer`'s `kv_head` kept or masked.
  absl::Status SetKeep(uint32_t layer, uint32_t kv_head, uint32_t position, bool keep);

 private:
  struct PageEntry {
    tiering::Tier tier = tiering::Tier::kT0;
    uint8_t* t0 = nullptr;  // T0 block
    uint64_t slot = 0;      // T1 / T2 slot offset
    uint32_t compressed_rows = 0;
    bool lossy = false;
    uint64_t version = 0;  // bumps on every change of the page's bytes or place
  };
  struct Staged {
    uint64_t version = 0;
    uint64_t last_use = 0;
    std::vector<float> data;           // the page, full precision
    std::vector<uint8_t> layer_ready;  // per layer of the group
  };

  TieredKvStore(const TieredKvStoreOptions& options, const StoreMemory& memory,
                const codecs::Codec* codec);

  // Full-precision bytes of a T0/T1 page, or null.
  float* PageFloats(uint32_t group, uint32_t page) const;
  uint64_t PageFloatsCount(uint32_t group) const { return geometry_.PageBytes(group) / 4; }
  uint64_t CompressedBlockOffset(uint32_t group, uint32_t layer_in_group,
                                 codecs::TensorRole role) const;
  void EncodePage(uint32_t group, const float* src, uint32_t rows, uint8_t* dst) const;
  void DecodePage(uint32_t group, const uint8_t* src, uint32_t rows, float* dst) const;
  void DecodeLayer(uint32_t group, uint32_t layer_in_group, const uint8_t* src, uint32_t rows,
                   float* dst) const;
  absl::Status EnsurePages(uint32_t group, uint64_t pages);
  const float* StagedLayer(uint32_t group, uint32_t page, uint32_t layer);
  void TrimStaging();
  void DropStaged(uint32_t group, uint32_t page);
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
  // Attention as two partials (pages in place, the rest) merged by log-sum-exp; `p` is the
  // unsplit call, its rows in k_rows_/v_rows_.
  void AttendSplit(const kernels::AttentionParams& p, uint32_t group);

  layout::KvGeometry geometry_;
  uint32_t num_q_heads_;
  float scale_;
  bool keep_mask_;
  uint32_t max_staged_pages_;
  kernels::Isa isa_;
  kernels::TaskRunner* runner_ = nullptr;  // not owned
  StoreMemory memory_;
  const codecs::Codec* codec_;
  uint64_t row_floats_;                           // num_kv_heads * head_dim
  std::vector<uint32_t> lengths_;                 // per layer
  std::vector<std::vector<PageEntry>> pages_;     // [group][page]
  std::vector<std::vector<uint8_t>> keep_;        // [layer * kv_heads + h][position]
  absl::flat_hash_map<uint64_t, Staged> staged_;  // key: group << 32 | page
  // Slots held now, per pool (0 = DDR, 1 = compressed): offset -> end. Kept in step with the
  // page table so validating a plan's destinations costs O(moves log pages).
  absl::btree_map<uint64_t, uint64_t> held_[2];
  uint64_t use_clock_ = 0;
  // Per-Attend buffers, kept to avoid reallocation.
  std::vector<const float*> k_rows_, v_rows_;
  std::vector<float> scratch_;
  // Split attention: [group][page] 1 = in place (empty = none), and per-Attend buffers.
  std::vector<std::vector<uint8_t>> in_place_;
  std::vector<const float*> split_k_[2], split_v_[2];
  std::vector<float> part_out_[2], part_lse_[2], part_mass_[2];
  StoreStats stats_;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_TIERED_KV_STORE_H_
