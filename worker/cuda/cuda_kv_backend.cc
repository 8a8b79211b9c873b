#include "worker/cuda/cuda_kv_backend.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "core/tiering/scores.h"
#include "worker/cuda/arena_buffers.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_device_arena.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_schedule.h"
#include "worker/cuda/host_partial.h"
#include "worker/cuda/layer_stager.h"
#include "worker/cuda/pinned_mapping.h"
#include "worker/host_kv_backend.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/kv_ops.h"
#include "worker/kernels/cuda/model_ops.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::cuda {
namespace {

namespace kc = kernels::cuda;
using tiering::Tier;

// Queries of one prefill launch: bounds the kernel's workspace (it grows with batch × length).
constexpr uint32_t kMaxBatch = 32;
// Blocks of one compressed offload or restore batch (the T2 scratch ring).
constexpr uint32_t kT2ScratchBlocks = 256;
// Staging entries a store starts with (regrown by doubling, at least to what a layer needs).
constexpr uint32_t kFirstStagingEntries = 64;

// Pool registrations for DMA, one per pool memory for every store of the worker (registering a
// range twice fails), keyed by the memory's owner (the client's mapping) and holding it: a
// record is unpinned when its last store lets go (BindPools of other pools, or the store's end),
// before its memory can be unmapped, and a new mapping at a reused address gets a new record.
// A pool the daemon pinned and mapped for the GPUs (CUDA VMM) is borrowed as it is.
class PinnedPools {
 public:
  absl::StatusOr<std::shared_ptr<PinnedMapping>> For(const PagePool& pool) {
    const std::shared_ptr<const void> owner = pool.memory_owner();
    return registry_.For(owner != nullptr ? owner.get() : pool.base(),
                         [&pool] { return PinnedMapping::ForPool(pool, {}); });
  }

 private:
  PinRegistry<PinnedMapping> registry_;
};

// Whether the event's work completed. cudaErrorNotReady is also left as the thread's last error:
// cleared here, or the next launcher's cudaGetLastError would report it.
bool EventDone(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) cudaGetLastError();
  return r == cudaSuccess;
}

// Completion tokens backed by CUDA events, in issue order. Not thread-safe.
class EventTokens {
 public:
  ~EventTokens() {
    for (auto& [token, event] : pending_) cudaEventDestroy(event);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  // A token for the work queued so far on `stream`; `then` (if not null) waits for it before its
  // later work.
  absl::StatusOr<CopyToken> Record(cudaStream_t stream, cudaStream_t then = nullptr) {
    cudaEvent_t e = nullptr;
    if (free_.empty()) {
      KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_.back();
      free_.pop_back();
    }
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream));
    pending_.emplace_back(++last_, e);
    if (then != nullptr) KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(then, e, 0));
    return last_;
  }
  // Every token up to `t` completed (streams differ: each is asked).
  bool Completed(CopyToken t) {
    Retire();
    for (auto& [token, event] : pending_) {
      if (token > t) break;
      if (!EventDone(event)) return false;
    }
    return true;
  }
  absl::Status Wait(CopyToken t) {
    for (auto& [token, event] : pending_) {
      if (token > t) break;
      KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event));
    }
    Retire();
    return absl::OkStatus();
  }

 private:
  void Retire() {
    while (!pending_.empty() && EventDone(pending_.front().second)) {
      free_.push_back(pending_.front().second);
      pending_.pop_front();
    }
  }
  CopyToken last_ = kNoCopyPending;
  std::deque<std::pair<CopyToken, cudaEvent_t>> pending_;
  std::vector<cudaEvent_t> free_;
};

// A page table uploaded for one Attend: pinned host staging, its device copy, and the event
// after which the host copy may be rewritten. A ring of num_layers + 1 lets the host run a
// whole forward pass ahead of the GPU without waiting.
struct PageTable {
  uint8_t* host = nullptr;
  uint8_t* dev = nullptr;
  uint64_t capacity = 0;
  cudaEvent_t uploaded = nullptr;
  // Of the last upload: [pages] entries, then [queries] page offsets, then [queries] lengths,
  // then [queries] pointers to the cumulative score each query's mass goes to.
  uint64_t pages = 0;
  uint32_t queries = 0;
};

kc::CodecKind CodecKindOf(const codecs::Codec& codec) {
  const std::string_view name(codec.name);
  return name == "fp8_e4m3" ? kc::CodecKind::kFp8E4m3
         : name == "minmax" ? kc::CodecKind::kMinMax
                            : kc::CodecKind::kInt8Kivi;
}

// The same layout in f32: what the CPU codecs and the host helpers read and write.
KvLayout F32Layout(KvLayout layout) {
  layout.geometry.element_bytes = 4;
  return layout;
}

// bf16 bits -> f32 (exact), and f32 -> bf16 (round to nearest even), `values` elements.
void Widen(const uint8_t* src, uint64_t values, float* dst) {
  const auto* bits = reinterpret_cast<const uint16_t*>(src);
  for (uint64_t i = 0; i < values; ++i) dst[i] = kc::Bf16BitsToF32(bits[i]);
}
void Narrow(const float* src, uint64_t values, uint8_t* dst) {
  auto* bits = reinterpret_cast<uint16_t*>(dst);
  for (uint64_t i = 0; i < values; ++i) bits[i] = kc::F32ToBf16Bits(src[i]);
}

void CountStaging(const StagedLayer& staged, StoreStats& stats) {
  stats.staged_h2d_bytes += staged.copied_bytes;
  stats.staged_copy_calls += staged.copy_calls;
  stats.staged_copy_descriptors += staged.copy_descriptors;
  stats.staged_batched_calls += staged.batched_calls;
}

// Device buffer that only grows (contents are not kept), in the HBM budget. The old one may
// still be read by work queued on `stream`, the only stream that uses it.
template <typename T>
absl::Status Grow(ArenaBuffers& device, cudaStream_t stream, T** p, uint64_t* capacity,
                  uint64_t needed, std::string_view what) {
  if (needed <= *capacity) return absl::OkStatus();
  const uint64_t n = std::max(needed, 2 * *capacity);
  if (*p != nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    device.Free(*p);
  }
  *p = nullptr;
  *capacity = 0;
  RETURN_IF_ERROR(device.Allocate(p, n * sizeof(T), what));
  *capacity = n;
  return absl::OkStatus();
}

class CudaKvBackend final : public KvBackend {
 public:
  CudaKvBackend(const TieredKvStoreOptions& options, const codecs::Codec* codec,
                cudaStream_t compute, PinnedPools* pinned, DeviceArena* arena)
      : device_(arena),
        arena_(arena),
        layout_{options.geometry, codec},
        num_q_heads_(options.num_q_heads),
        scale_(AttentionScale(options)),
        compute_(compute),
        pinned_(pinned),
        dtype_(options.geometry.element_bytes == 2 ? kc::KvDtype::kBf16 : kc::KvDtype::kF32),
        host_(HostKvBackendOptions{
            .layout = F32Layout(layout_), .num_q_heads = options.num_q_heads, .scale = scale_}),
        tables_(options.geometry.num_layers + 1),
        host_partial_(layout_, options.num_q_heads, scale_) {}
  ~CudaKvBackend() override;

  bool host_t0() const override { return false; }
  bool device_scores() const override { return true; }
  bool StoresElementBytes(uint32_t element_bytes) const override {
    return element_bytes == 4 || element_bytes == 2;
  }
  absl::Status BindPools(PagePool* ddr, PagePool* compressed) override;
  absl::Status ClearBlock(uint8_t* block, uint64_t bytes) override;
  absl::Status WriteRows(uint8_t* k_dst, uint8_t* v_dst, const float* k, const float* v,
                         uint32_t rows, uint64_t row_floats) override;
  absl::Status CopyPage(Tier from, const uint8_t* src, Tier to, uint8_t* dst,
                        uint64_t bytes) override;
  absl::Status EncodePage(Tier from, const uint8_t* src, uint32_t group, uint32_t rows,
                          uint8_t* dst) override;
  absl::Status DecodePage(const uint8_t* src, uint32_t group, uint32_t rows, Tier to,
                          uint8_t* dst) override;
  absl::Status ReadPage(const StoredPage& page, uint32_t group, const uint8_t* ddr_base,
                        const uint8_t* compressed_base, float* dst) override;
  CopyToken LastToken() override;
  bool Completed(CopyToken token) override { return tokens_.Completed(token); }
  absl::Status Wait(CopyToken token) override { return tokens_.Wait(token); }
  absl::Status Drain() override;
  void Forget(uint32_t, uint32_t) override {}  // staged copies are keyed by version
  absl::Status FollowSchedule(const StageSchedule& schedule,
                              const std::vector<std::vector<StoredPage>>& pages) override;
  absl::Status Attend(const AttendCall& call, StoreStats& stats) override;
  absl::Status AttendBatch(const std::vector<KvBackend*>& backends,
                           const std::vector<AttendCall>& calls,
                           const std::vector<StoreStats*>& stats) override;
  absl::Status TakeScores(uint32_t length, std::vector<std::vector<float>>* scores) override;

 private:
  uint64_t BlockBytes() const { return layout_.LayerBlockBytes(); }
  bool bf16() const { return dtype_ == kc::KvDtype::kBf16; }
  // Elements of one page of `group`.
  uint64_t PageValues(uint32_t group) const {
    return layout_.geometry.PageBytes(group) / layout_.geometry.element_bytes;
  }
  LayerStagerOptions StagerOptions(uint32_t entries) const;
  absl::Status EnsureStager(uint32_t entries);
  // Records the token of a copy just issued on `stream`; `then` is ordered after it.
  absl::Status Issued(cudaStream_t stream, cudaStream_t then = nullptr);
  // Host-memory moves (T1 <-> T2) run on the CPU once no copy touches the pools.
  absl::Status DrainCopies();
  // The request of one T1/T2 page for layer `layer` of its group.
  StageRequest RequestFor(const StoredPage& e, uint32_t page, uint32_t layer_in_group) const;
  // The layer's T1/T2 pages as staging requests (page indices beside them): the resident ones
  // into resident_requests_, the rest into requests_ (the schedule's stage pages in its order,
  // then, unless `split`, the in-place pages, then the pages it does not name, in page order).
  void BuildRequests(const AttendCall& call, uint32_t layer, bool split);
  // A decode query with a page of [0, length) the schedule attends in place (T1/T2 still).
  bool SplitsCall(const AttendCall& call) const;
  // One store's share of an attention launch: its call (run for `owner`, whose scores the
  // mass goes to) and, per page, the device block staged for it (null: not staged).
  struct LaunchPart {
    CudaKvBackend* owner;
    const AttendCall* call;
    const std::vector<uint8_t*>* staged;
  };
  // Stages the call's T1/T2 pages (not the in-place ones when `split`) and makes the compute
  // stream wait for them; *any: something was staged.
  absl::Status StageFor(const AttendCall& call, bool split, StoreStats& stats,
                        std::vector<uint8_t*>* staged, bool* any);
  absl::Status EnsureResidentArea(uint32_t entries);
  // After the launch: releases the staging slots and prefetches the next layer.
  absl::Status FinishAttend(const AttendCall& call, bool staged, bool split, StoreStats& stats);
  // Split attention of one decode query: the GPU's partial over T0 and staged pages, the CPU's
  // over the in-place pages (concurrently), merged on the device.
  absl::Status AttendSplit(const AttendCall& call, StoreStats& stats);
  // One page table for every part (this backend's ring), queries in part order.
  absl::StatusOr<PageTable*> UploadTable(const std::vector<LaunchPart>& parts);
  absl::Status EnsureScores(uint32_t length);
  // The store's shape and the workspace; the caller sets the tensors and sizes.
  kc::PagedDecodeParams DecodeParams() const;
  // REQUIRES: the parts' queries (and outputs) are consecutive rows from parts[0].call->q.
  absl::Status LaunchAttention(const std::vector<LaunchPart>& parts, const PageTable& table);
  // Host-to-device bytes it issued go to `stats`.
  absl::Status PrefetchNext(const AttendCall& call, bool split, StoreStats& stats);

  // Working memory in the HBM budget; declared first, so freed last.
  ArenaBuffers device_;
  DeviceArena* arena_;  // not owned: the worker's
  KvLayout layout_;
  uint32_t num_q_heads_;
  float scale_;
  cudaStream_t compute_;
  PinnedPools* pinned_;         // not owned
  kc::KvDtype dtype_;           // of T0, T1 and staged blocks
  HostKvBackend host_;          // the CPU codecs (f32), for moves between host tiers
  std::vector<float> widened_;  // one page as f32, for host moves and reads of a bf16 store
  // Held while bound; declared before the stager, which uses them and is destroyed first.
  std::shared_ptr<PinnedMapping> t1_pins_, t2_pins_;
  PinnedMapping* t1_ = nullptr;
  PinnedMapping* t2_ = nullptr;
  std::unique_ptr<LayerStager> stager_;
  EventTokens tokens_;
  bool issued_since_token_ = false;
  CopyToken last_copy_ = kNoCopyPending;
  std::vector<PageTable> tables_;
  size_t next_table_ = 0;
  float* workspace_ = nullptr;
  uint64_t workspace_floats_ = 0;
  float* mass_ = nullptr;  // [kMaxBatch][length] position mass of one launch
  uint64_t mass_floats_ = 0;
  float* scores_ = nullptr;  // [groups][score_capacity_] cumulative score since the last read
  uint64_t score_capacity_ = 0;
  std::vector<StageRequest> requests_, resident_requests_;
  std::vector<uint32_t> request_pages_, resident_pages_;
  // Split attention (FollowSchedule): the schedule in force, the CPU partial, and per split
  // Attend a pinned buffer [q][out][lse][head_mass] (a ring of two: the host rewrites one once
  // its upload ran) and the device's copy of the CPU part and its own part.
  DeviceSchedule schedule_;
  HostPartial host_partial_;
  std::vector<uint8_t> in_place_mask_;
  struct SplitBuffer {
    float* host = nullptr;
    uint64_t capacity = 0;  // floats
    cudaEvent_t q_ready = nullptr, uploaded = nullptr;
  };
  SplitBuffer split_bufs_[2];
  int next_split_ = 0;
  float* split_dev_ = nullptr;  // [2][q | out | lse | head_mass]: the GPU's part, then the CPU's
  uint64_t split_dev_floats_ = 0;
};

CudaKvBackend::~CudaKvBackend() {
  (void)Drain();
  stager_.reset();
  for (PageTable& t : tables_) {  // device memory is device_'s, freed after this
    cudaFreeHost(t.host);
    if (t.uploaded != nullptr) cudaEventDestroy(t.uploaded);
  }
  for (SplitBuffer& b : split_bufs_) {
    cudaFreeHost(b.host);
    if (b.q_ready != nullptr) cudaEventDestroy(b.q_ready);
    if (b.uploaded != nullptr) cudaEventDestroy(b.uploaded);
  }
}

LayerStagerOptions CudaKvBackend::StagerOptions(uint32_t entries) const {
  LayerStagerOptions o;
  o.num_slots = 2;
  o.entries_per_slot = entries;
  o.page_tokens = layout_.geometry.page_tokens;
  o.num_kv_heads = layout_.geometry.num_kv_heads;
  o.head_dim = layout_.geometry.head_dim;
  o.dtype = dtype_;
  o.codec = CodecKindOf(*layout_.codec);
  o.max_offload_batch = kT2ScratchBlocks;
  o.arena = arena_;
  return o;
}

absl::Status CudaKvBackend::BindPools(PagePool* ddr, PagePool* compressed) {
  RETURN_IF_ERROR(Drain());
  stager_.reset();
  t1_ = t2_ = nullptr;
  t1_pins_.reset();  // the old pools' records: unpinned here when no other store holds them
  t2_pins_.reset();
  if (ddr != nullptr) {
    ASSIGN_OR_RETURN(t1_pins_, pinned_->For(*ddr));
    t1_ = t1_pins_.get();
  }
  if (compressed != nullptr) {
    ASSIGN_OR_RETURN(t2_pins_, pinned_->For(*compressed));
    t2_ = t2_pins_.get();
  }
  // Without a T1 pool no page leaves T0 for host memory: nothing to stage or copy.
  return t1_ != nullptr ? EnsureStager(kFirstStagingEntries) : absl::OkStatus();
}

absl::Status CudaKvBackend::EnsureStager(uint32_t entries) {
  if (t1_ == nullptr) return absl::FailedPreconditionError("the store has no T1 pool");
  if (stager_ != nullptr && stager_->options().entries_per_slot >= entries) {
    return absl::OkStatus();
  }
  // A store without one (a growth the HBM budget refused) starts over at the first size.
  const uint32_t n = std::max(
      entries, stager_ == nullptr ? kFirstStagingEntries : 2 * stager_->options().entries_per_slot);
  // The old slots may still be read by queued attention; the stager drains its own streams.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  stager_.reset();
  ASSIGN_OR_RETURN(stager_, LayerStager::Create(StagerOptions(n), t1_, t2_));
  return absl::OkStatus();
}

absl::Status CudaKvBackend::Issued(cudaStream_t stream, cudaStream_t then) {
  ASSIGN_OR_RETURN(last_copy_, tokens_.Record(stream, then));
  issued_since_token_ = true;
  return absl::OkStatus();
}

CopyToken CudaKvBackend::LastToken() {
  if (issued_since_token_) {
    issued_since_token_ = false;
    return last_copy_;
  }
  // No copy since the last token: what may still read a block is the engine's queued work.
  absl::StatusOr<CopyToken> t = tokens_.Record(compute_);
  return t.ok() ? *t : last_copy_;
}

absl::Status CudaKvBackend::DrainCopies() {
  if (stager_ == nullptr) return absl::OkStatus();
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stager_->d2h_stream()));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stager_->h2d_stream()));
  return absl::OkStatus();
}

absl::Status CudaKvBackend::Drain() {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  RETURN_IF_ERROR(DrainCopies());
  return tokens_.Wait(~CopyToken{0});
}

absl::Status CudaKvBackend::ClearBlock(uint8_t* block, uint64_t bytes) {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(block, 0, bytes, compute_));
  return absl::OkStatus();
}

absl::Status CudaKvBackend::WriteRows(uint8_t* k_dst, uint8_t* v_dst, const float* k,
                                      const float* v, uint32_t rows, uint64_t row_floats) {
  if (bf16()) {  // the engine's f32 rows (device memory), rounded into the page
    const uint64_t n = uint64_t{rows} * row_floats;
    KVTIER_CUDA_RETURN_IF_ERROR(
        kc::CastF32ToBf16(k, n, reinterpret_cast<uint16_t*>(k_dst), compute_));
    KVTIER_CUDA_RETURN_IF_ERROR(
        kc::CastF32ToBf16(v, n, reinterpret_cast<uint16_t*>(v_dst), compute_));
    return absl::OkStatus();
  }
  const uint64_t bytes = rows * row_floats * 4;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k_dst, k, bytes, cudaMemcpyDefault, compute_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_dst, v, bytes, cudaMemcpyDefault, compute_));
  return absl::OkStatus();
}

absl::Status CudaKvBackend::CopyPage(Tier from, const uint8_t* src, Tier to, uint8_t* dst,
                                     uint64_t bytes) {
  if (t1_ == nullptr) return absl::FailedPreconditionError("the store has no T1 pool");
  RETURN_IF_ERROR(EnsureStager(kFirstStagingEntries));
  const uint64_t block = BlockBytes();
  const uint32_t layers = static_cast<uint32_t>(bytes / block);
  if (from == Tier::kT0 && to == Tier::kT1) {
    std::vector<OffloadOp> ops;
    for (uint32_t l = 0; l < layers; ++l) {
      ops.push_back({src + l * block, static_cast<uint64_t>(dst - t1_->base()) + l * block});
    }
    RETURN_IF_ERROR(stager_->Offload(ops, compute_));
    // Staging reads the slot on the H2D stream: after the offload landed.
    return Issued(stager_->d2h_stream(), stager_->h2d_stream());
  }
  if (from == Tier::kT1 && to == Tier::kT0) {
    std::vector<RestoreOp> ops;
    for (uint32_t l = 0; l < layers; ++l) {
      ops.push_back({static_cast<uint64_t>(src - t1_->base()) + l * block, dst + l * block,
                     StageSource::kFull});
    }
    RETURN_IF_ERROR(stager_->Restore(ops, compute_));
    return Issued(stager_->h2d_stream());
  }
  return absl::InvalidArgumentError(absl::StrCat("no full-precision copy from ",
                                                 std::string(tiering::TierName(from)), " to ",
                                                 std::string(tiering::TierName(to))));
}

absl::Status CudaKvBackend::EncodePage(Tier from, const uint8_t* src, uint32_t group, uint32_t rows,
                                       uint8_t* dst) {
  if (from != Tier::kT0) {
    RETURN_IF_ERROR(DrainCopies());
    if (!bf16()) return host_.EncodePage(from, src, group, rows, dst);
    widened_.resize(PageValues(group));
    Widen(src, widened_.size(), widened_.data());
    return host_.EncodePage(from, reinterpret_cast<const uint8_t*>(widened_.data()), group, rows,
                            dst);
  }
  if (t1_ == nullptr || t2_ == nullptr) {
    return absl::FailedPreconditionError("the store has no T2 pool");
  }
  RETURN_IF_ERROR(EnsureStager(kFirstStagingEntries));
  // The device codec quantizes whole pages: the page being written never reaches T2.
  if (rows != layout_.geometry.page_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows (", rows, ") must be page_tokens (", layout_.geometry.page_tokens, ")"));
  }
  std::vector<OffloadOp> ops;
  for (uint32_t l = 0; l < layout_.geometry.LayersInGroup(group); ++l) {
    ops.push_back(
        {src + l * BlockBytes(), static_cast<uint64_t>(dst - t2_->base()) +
                                     layout_.CompressedBlockOffset(l, codecs::TensorRole::kKey)});
  }
  RETURN_IF_ERROR(stager_->OffloadCompressed(ops, compute_));
  return Issued(stager_->d2h_stream(), stager_->h2d_stream());
}

absl::Status CudaKvBackend::DecodePage(const uint8_t* src, uint32_t group, uint32_t rows, Tier to,
                                       uint8_t* dst) {
  if (to != Tier::kT0) {
    RETURN_IF_ERROR(DrainCopies());
    if (!bf16()) return host_.DecodePage(src, group, rows, to, dst);
    widened_.resize(PageValues(group));
    RETURN_IF_ERROR(
        host_.DecodePage(src, group, rows, to, reinterpret_cast<uint8_t*>(widened_.data())));
    Narrow(widened_.data(), widened_.size(), dst);
    return absl::OkStatus();
  }
  if (t1_ == nullptr || t2_ == nullptr) {
    return absl::FailedPreconditionError("the store has no T2 pool");
  }
  RETURN_IF_ERROR(EnsureStager(kFirstStagingEntries));
  std::vector<RestoreOp> ops;
  for (uint32_t l = 0; l < layout_.geometry.LayersInGroup(group); ++l) {
    ops.push_back({static_cast<uint64_t>(src - t2_->base()) +
                       layout_.CompressedBlockOffset(l, codecs::TensorRole::kKey),
                   dst + l * BlockBytes(), StageSource::kCompressed});
  }
  RETURN_IF_ERROR(stager_->Restore(ops, compute_));
  return Issued(stager_->h2d_stream());
}

absl::Status CudaKvBackend::ReadPage(const StoredPage& page, uint32_t group,
                                     const uint8_t* ddr_base, const uint8_t* compressed_base,
                                     float* dst) {
  if (page.tier == Tier::kT2 || (page.tier == Tier::kT1 && !bf16())) {
    RETURN_IF_ERROR(DrainCopies());  // the CPU codec decodes T2 to f32 values
    return host_.ReadPage(page, group, ddr_base, compressed_base, dst);
  }
  if (page.tier == Tier::kT1) {
    RETURN_IF_ERROR(DrainCopies());
    Widen(ddr_base + page.slot, PageValues(group), dst);
    return absl::OkStatus();
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  if (!bf16()) {
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, page.t0, layout_.geometry.PageBytes(group), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }
  std::vector<uint8_t> bits(layout_.geometry.PageBytes(group));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(bits.data(), page.t0, bits.size(), cudaMemcpyDeviceToHost));
  Widen(bits.data(), PageValues(group), dst);
  return absl::OkStatus();
}

StageRequest CudaKvBackend::RequestFor(const StoredPage& e, uint32_t page,
                                       uint32_t layer_in_group) const {
  if (e.tier == Tier::kT1) {
    return {page, e.version, e.slot + layer_in_group * BlockBytes(), BlockBytes(),
            StageSource::kFull};
  }
  return {page, e.version,
          e.slot + layout_.CompressedBlockOffset(layer_in_group, codecs::TensorRole::kKey),
          stager_->options().CompressedBlockBytes(), StageSource::kCompressed};
}

void CudaKvBackend::BuildRequests(const AttendCall& call, uint32_t layer, bool split) {
  requests_.clear();
  request_pages_.clear();
  resident_requests_.clear();
  resident_pages_.clear();
  const layout::KvGeometry& g = layout_.geometry;
  const uint32_t l = layer - g.GroupBegin(call.group);
  const uint64_t n = g.NumPages(call.length);
  auto host = [&](uint32_t p) {
    return p < n && (call.pages[p].tier == Tier::kT1 || call.pages[p].tier == Tier::kT2);
  };
  auto add = [&](uint32_t p) {
    requests_.push_back(RequestFor(call.pages[p], p, l));
    request_pages_.push_back(p);
  };
  if (!schedule_.empty()) {
    for (uint32_t p : schedule_.StageOrder(call.group)) {
      if (host(p)) add(p);
    }
  }
  for (uint32_t p = 0; p < n; ++p) {
    if (!host(p)) continue;
    switch (schedule_.RoleOf(call.group, p)) {
      case PageRole::kResident:
        resident_requests_.push_back(RequestFor(call.pages[p], p, l));
        resident_pages_.push_back(p);
        break;
      case PageRole::kInPlace:
        if (!split) add(p);  // a prefill attends whole
        break;
      case PageRole::kWhole:
        add(p);
        break;
      case PageRole::kStage:
        break;  // above, in the schedule's order
    }
  }
}

bool CudaKvBackend::SplitsCall(const AttendCall& call) const {
  if (call.n != 1 || schedule_.empty()) return false;
  const uint64_t n = layout_.geometry.NumPages(call.length);
  for (uint32_t p = 0; p < n; ++p) {
    if ((call.pages[p].tier == Tier::kT1 || call.pages[p].tier == Tier::kT2) &&
        schedule_.RoleOf(call.group, p) == PageRole::kInPlace) {
      return true;
    }
  }
  return false;
}

absl::Status CudaKvBackend::FollowSchedule(const StageSchedule& schedule,
                                           const std::vector<std::vector<StoredPage>>& pages) {
  DevicePageBytes bytes;
  bytes.block = BlockBytes();
  bytes.compressed_block = StagerOptions(1).CompressedBlockBytes();
  // Everything is checked before anything changes: a refused schedule issues nothing.
  ASSIGN_OR_RETURN(DeviceSchedule next,
                   DeviceSchedule::Make(schedule, pages, layout_.geometry, bytes));
  schedule_ = std::move(next);
  host_partial_.Forget();
  return absl::OkStatus();
}

absl::StatusOr<PageTable*> CudaKvBackend::UploadTable(const std::vector<LaunchPart>& parts) {
  const layout::KvGeometry& g = layout_.geometry;
  uint64_t pages = 0;
  uint32_t queries = 0;
  for (const LaunchPart& part : parts) {
    pages += g.NumPages(part.call->length);
    queries += part.call->n;
    // Before the table names the score rows: growing them moves them.
    RETURN_IF_ERROR(part.owner->EnsureScores(part.call->length));
  }
  // Pointers first, then the int32 arrays (2 × queries × 4 bytes: the pointers after them stay
  // aligned).
  const uint64_t bytes =
      pages * sizeof(void*) + 2 * uint64_t{queries} * sizeof(int32_t) + queries * sizeof(float*);
  PageTable& t = tables_[next_table_];
  next_table_ = (next_table_ + 1) % tables_.size();
  if (t.uploaded == nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.uploaded, cudaEventDisableTiming));
  }
  // The host copy was last read by an upload one forward pass ago.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(t.uploaded));
  if (bytes > t.capacity) {
    const uint64_t n = std::max<uint64_t>(bytes, 2 * t.capacity);
    // The old copies were last read by uploads on the compute stream.
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    cudaFreeHost(t.host);
    device_.Free(t.dev);
    t.host = t.dev = nullptr;
    t.capacity = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(PinnedMalloc(&t.host, n));
    RETURN_IF_ERROR(device_.Allocate(&t.dev, n, "page table"));
    t.capacity = n;
  }
  t.pages = pages;
  t.queries = queries;
  auto* entries = reinterpret_cast<const void**>(t.host);
  auto* indptr = reinterpret_cast<int32_t*>(t.host + pages * sizeof(void*));
  int32_t* lengths = indptr + queries;
  auto* score_rows = reinterpret_cast<float**>(lengths + queries);
  uint64_t first = 0;
  uint32_t row = 0;
  for (const LaunchPart& part : parts) {
    const AttendCall& call = *part.call;
    const uint64_t n_pages = g.NumPages(call.length);
    const uint64_t layer_off = layout_.LayerOffsetBytes(call.layer - g.GroupBegin(call.group));
    for (uint64_t p = 0; p < n_pages; ++p) {
      const StoredPage& e = call.pages[p];
      entries[first + p] = e.tier == Tier::kT0   ? e.t0 + layer_off
                           : e.tier == Tier::kT3 ? nullptr
                                                 : (*part.staged)[p];  // null: in place
    }
    // Query b of the call sits at position length - n + b: one "sequence" per query over the
    // call's pages.
    float* scores = part.owner->scores_ + uint64_t{call.group} * part.owner->score_capacity_;
    for (uint32_t b = 0; b < call.n; ++b, ++row) {
      indptr[row] = static_cast<int32_t>(first);
      lengths[row] = static_cast<int32_t>(call.length - call.n + b + 1);
      score_rows[row] = scores;
    }
    first += n_pages;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(t.dev, t.host, bytes, cudaMemcpyHostToDevice, compute_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.uploaded, compute_));
  return &t;
}

absl::Status CudaKvBackend::EnsureScores(uint32_t length) {
  if (length <= score_capacity_) return absl::OkStatus();
  const uint64_t cap = std::max<uint64_t>({length, 2 * score_capacity_, 1024});
  const uint32_t groups = layout_.geometry.layer_groups;
  float* grown = nullptr;
  RETURN_IF_ERROR(device_.Allocate(&grown, groups * cap * sizeof(float), "cumulative scores"));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grown, 0, groups * cap * sizeof(float), compute_));
  if (scores_ != nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        grown, cap * sizeof(float), scores_, score_capacity_ * sizeof(float),
        score_capacity_ * sizeof(float), groups, cudaMemcpyDeviceToDevice, compute_));
    // The old scores are read by the copy above and by queued launches, all on compute_.
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    device_.Free(scores_);
  }
  scores_ = grown;
  score_capacity_ = cap;
  return absl::OkStatus();
}

kc::PagedDecodeParams CudaKvBackend::DecodeParams() const {
  kc::PagedDecodeParams p;
  p.workspace = workspace_;
  p.num_q_heads = num_q_heads_;
  p.num_kv_heads = layout_.geometry.num_kv_heads;
  p.head_dim = layout_.geometry.head_dim;
  p.page_tokens = layout_.geometry.page_tokens;
  p.scale = scale_;
  p.kv_dtype = dtype_;
  return p;
}

absl::Status CudaKvBackend::LaunchAttention(const std::vector<LaunchPart>& parts,
                                            const PageTable& table) {
  const layout::KvGeometry& g = layout_.geometry;
  const uint64_t q_row = uint64_t{num_q_heads_} * g.head_dim;
  const auto* indptr = reinterpret_cast<const int32_t*>(table.dev + table.pages * sizeof(void*));
  const int32_t* lengths = indptr + table.queries;
  const int32_t* host_lengths =
      reinterpret_cast<const int32_t*>(table.host + table.pages * sizeof(void*)) + table.queries;
  auto* const* score_rows = reinterpret_cast<float* const*>(lengths + table.queries);
  uint32_t max_length = 0;
  for (const LaunchPart& part : parts) max_length = std::max(max_length, part.call->length);
  const uint32_t batch = std::min(table.queries, kMaxBatch);
  RETURN_IF_ERROR(
      Grow(device_, compute_, &workspace_, &workspace_floats_,
           kc::PagedDecodeWorkspaceBytes(batch, max_length, num_q_heads_, g.head_dim) / 4,
           "attention workspace"));
  RETURN_IF_ERROR(Grow(device_, compute_, &mass_, &mass_floats_, uint64_t{batch} * max_length,
                       "position mass"));
  const AttendCall& first = *parts[0].call;
  const float weight = tiering::DeviceMassWeight(num_q_heads_, g.LayersInGroup(first.group));
  for (uint32_t r0 = 0; r0 < table.queries; r0 += kMaxBatch) {
    const uint32_t rows = std::min(kMaxBatch, table.queries - r0);
    kc::PagedDecodeParams p = DecodeParams();
    p.q = first.q + r0 * q_row;
    p.out = first.out + r0 * q_row;
    p.pages = reinterpret_cast<const void* const*>(table.dev);
    p.page_indptr = indptr + r0;
    p.lengths = lengths + r0;
    p.position_mass = mass_;
    p.mass_stride = max_length;
    p.batch = rows;
    p.max_length =
        static_cast<uint32_t>(*std::max_element(host_lengths + r0, host_lengths + r0 + rows));
    KVTIER_CUDA_RETURN_IF_ERROR(kc::PagedDecodeAttention(p, compute_));
    // Each row's mass goes to its own store's cumulative score: one launch for the chunk.
    kc::ScoreBatchParams s;
    s.mass = mass_;
    s.rows = rows;
    s.mass_stride = max_length;
    s.max_length = p.max_length;
    s.lengths = lengths + r0;
    s.scores = score_rows + r0;
    s.weight = weight;
    KVTIER_CUDA_RETURN_IF_ERROR(kc::AccumulateScoresBatch(s, compute_));
  }
  return absl::OkStatus();
}

absl::Status CudaKvBackend::PrefetchNext(const AttendCall& call, bool split, StoreStats& stats) {
  // One layer ahead, within the group (the pages of another group are another table). After
  // the last layer, layer 0 of the next step, whose pages are this step's unless a plan moves
  // them (the planner then copies what changed): with one group only, since with several the
  // next layer to run is another group's, whose slot the wrap could hold.
  const layout::KvGeometry& g = layout_.geometry;
  uint32_t next = call.layer + 1;
  if (next == g.num_layers && g.layer_groups == 1) next = 0;
  if (stager_ == nullptr || next >= g.num_layers || g.GroupOfLayer(next) != call.group) {
    return absl::OkStatus();
  }
  BuildRequests(call, next, split);
  // Only into the areas this layer already sized (growing one waits for the device).
  if (!resident_requests_.empty() && next < stager_->resident_layers() &&
      resident_requests_.size() <= stager_->resident_entries()) {
    ASSIGN_OR_RETURN(StagedLayer staged, stager_->PrefetchResident(next, resident_requests_));
    CountStaging(staged, stats);
    stats.resident_h2d_bytes += staged.copied_bytes;
  }
  if (requests_.empty() || !stager_->CanPrefetch(next) ||
      requests_.size() > stager_->options().entries_per_slot) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(StagedLayer staged, stager_->Prefetch(next, requests_));
  CountStaging(staged, stats);
  return absl::OkStatus();
}

absl::Status CudaKvBackend::EnsureResidentArea(uint32_t entries) {
  const uint32_t layers = layout_.geometry.num_layers;
  if (stager_->resident_layers() >= layers && stager_->resident_entries() >= entries) {
    return absl::OkStatus();
  }
  // The old area may still be read by queued attention.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  return stager_->EnsureResident(layers, std::max(entries, schedule_.max_resident()));
}

absl::Status CudaKvBackend::StageFor(const AttendCall& call, bool split, StoreStats& stats,
                                     std::vector<uint8_t*>* staged, bool* any) {
  staged->assign(layout_.geometry.NumPages(call.length), nullptr);
  *any = false;
  if (t1_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureStager(kFirstStagingEntries));  // gone if a growth was refused
  BuildRequests(call, call.layer, split);
  if (requests_.empty() && resident_requests_.empty()) return absl::OkStatus();
  // Sized first: a larger stager is a new one, with an empty resident area.
  if (!requests_.empty()) {
    RETURN_IF_ERROR(EnsureStager(static_cast<uint32_t>(requests_.size())));
  }
  if (!resident_requests_.empty()) {
    RETURN_IF_ERROR(EnsureResidentArea(static_cast<uint32_t>(resident_requests_.size())));
    ASSIGN_OR_RETURN(StagedLayer kept, stager_->PrefetchResident(call.layer, resident_requests_));
    CountStaging(kept, stats);
    stats.resident_h2d_bytes += kept.copied_bytes;
    for (size_t i = 0; i < resident_pages_.size(); ++i) {
      (*staged)[resident_pages_[i]] = kept.blocks[i];
    }
  }
  if (!requests_.empty()) {
    ASSIGN_OR_RETURN(StagedLayer layer, stager_->Prefetch(call.layer, requests_));
    CountStaging(layer, stats);
    for (size_t i = 0; i < request_pages_.size(); ++i) {
      (*staged)[request_pages_[i]] = layer.blocks[i];
    }
  }
  RETURN_IF_ERROR(stager_->Acquire(call.layer, compute_));
  *any = true;
  return absl::OkStatus();
}

absl::Status CudaKvBackend::FinishAttend(const AttendCall& call, bool staged, bool split,
                                         StoreStats& stats) {
  if (staged) RETURN_IF_ERROR(stager_->Release(call.layer, compute_));
  return PrefetchNext(call, split, stats);
}

absl::Status CudaKvBackend::Attend(const AttendCall& call, StoreStats& stats) {
  if (SplitsCall(call)) return AttendSplit(call, stats);
  std::vector<uint8_t*> staged;
  bool any = false;
  RETURN_IF_ERROR(StageFor(call, /*split=*/false, stats, &staged, &any));
  const std::vector<LaunchPart> parts = {{this, &call, &staged}};
  ASSIGN_OR_RETURN(PageTable * table, UploadTable(parts));
  RETURN_IF_ERROR(LaunchAttention(parts, *table));
  return FinishAttend(call, any, /*split=*/false, stats);
}

absl::Status CudaKvBackend::AttendSplit(const AttendCall& call, StoreStats& stats) {
  const layout::KvGeometry& g = layout_.geometry;
  const uint32_t length = call.length, heads = num_q_heads_;
  const uint64_t q_floats = uint64_t{heads} * g.head_dim;
  const uint64_t part_floats = q_floats + heads + uint64_t{heads} * length;  // out, lse, mass
  // The CPU needs the query: downloaded ahead of the GPU's partial, so both run at once.
  SplitBuffer& buf = split_bufs_[next_split_];
  next_split_ ^= 1;
  if (buf.q_ready == nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&buf.q_ready, cudaEventDisableTiming));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&buf.uploaded, cudaEventDisableTiming));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(buf.uploaded));  // its last upload ran
  if (q_floats + part_floats > buf.capacity) {
    // Doubled: the length grows by one a step, and cudaFreeHost waits for the device.
    const uint64_t n = std::max<uint64_t>(q_floats + part_floats, 2 * buf.capacity);
    cudaFreeHost(buf.host);
    buf.host = nullptr;
    buf.capacity = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(PinnedMalloc(&buf.host, n * sizeof(float)));
    buf.capacity = n;
  }
  RETURN_IF_ERROR(
      Grow(device_, compute_, &split_dev_, &split_dev_floats_, 2 * part_floats, "split partials"));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf.host, call.q, q_floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, compute_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(buf.q_ready, compute_));
  // The GPU's partial: T0 and staged pages, in-place ones null in the table.
  std::vector<uint8_t*> staged;
  bool any = false;
  RETURN_IF_ERROR(StageFor(call, /*split=*/true, stats, &staged, &any));
  const std::vector<LaunchPart> parts = {{this, &call, &staged}};
  ASSIGN_OR_RETURN(PageTable * table, UploadTable(parts));
  RETURN_IF_ERROR(EnsureScores(length));
  RETURN_IF_ERROR(Grow(device_, compute_, &workspace_, &workspace_floats_,
                       kc::PagedDecodeWorkspaceBytes(1, length, heads, g.head_dim) / 4,
                       "attention workspace"));
  RETURN_IF_ERROR(Grow(device_, compute_, &mass_, &mass_floats_, length, "position mass"));
  float* dev_part[2] = {split_dev_, split_dev_ + part_floats};  // GPU's, CPU's
  kc::PagedDecodeParams p = DecodeParams();
  p.q = call.q;
  p.out = dev_part[0];
  p.lse = dev_part[0] + q_floats;
  p.head_mass = dev_part[0] + q_floats + heads;
  p.mass_stride = length;
  p.pages = reinterpret_cast<const void* const*>(table->dev);
  p.page_indptr = reinterpret_cast<const int32_t*>(table->dev + table->pages * sizeof(void*));
  p.lengths = p.page_indptr + 1;
  p.batch = 1;
  p.max_length = length;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::PagedDecodeAttention(p, compute_));
  // The CPU's partial, from pool memory, while the device computes its own; the pages it reads
  // may have been written by offloads still in flight.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(buf.q_ready));
  if (stager_ != nullptr) RETURN_IF_ERROR(stager_->WaitOffloads());
  in_place_mask_.assign(g.NumPages(length), 0);
  for (uint32_t page = 0; page < in_place_mask_.size(); ++page) {
    const Tier t = call.pages[page].tier;
    in_place_mask_[page] = (t == Tier::kT1 || t == Tier::kT2) &&
                           schedule_.RoleOf(call.group, page) == PageRole::kInPlace;
  }
  float* host_part = buf.host + q_floats;
  RETURN_IF_ERROR(
      host_partial_.Run(call, buf.host, in_place_mask_,
                        {host_part, host_part + q_floats, host_part + q_floats + heads}));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_part[1], host_part, part_floats * sizeof(float),
                                              cudaMemcpyHostToDevice, compute_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(buf.uploaded, compute_));
  // Merged by log-sum-exp on the device; the mass of both parts feeds the cumulative score.
  kc::SplitMergeParams m;
  for (int i = 0; i < 2; ++i) {
    m.out[i] = dev_part[i];
    m.lse[i] = dev_part[i] + q_floats;
    m.head_mass[i] = dev_part[i] + q_floats + heads;
  }
  m.merged = call.out;
  m.position_mass = mass_;
  m.num_q_heads = heads;
  m.head_dim = g.head_dim;
  m.length = length;
  m.mass_stride = length;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::MergeSplitAttention(m, compute_));
  kc::ScoreAccumulateParams sa;
  sa.mass = mass_;
  sa.rows = 1;
  sa.mass_stride = length;
  sa.first_length = length;
  sa.weight = tiering::DeviceMassWeight(heads, g.LayersInGroup(call.group));
  sa.scores = scores_ + uint64_t{call.group} * score_capacity_;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AccumulateScores(sa, compute_));
  ++stats.split_attends;
  return FinishAttend(call, any, /*split=*/true, stats);
}

absl::Status CudaKvBackend::AttendBatch(const std::vector<KvBackend*>& backends,
                                        const std::vector<AttendCall>& calls,
                                        const std::vector<StoreStats*>& stats) {
  // One launch needs CUDA peers on this stream, of this head shape, with consecutive queries;
  // anything else attends call by call.
  const uint64_t q_row = uint64_t{num_q_heads_} * layout_.geometry.head_dim;
  std::vector<CudaKvBackend*> peers;
  uint64_t row = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto* peer = dynamic_cast<CudaKvBackend*>(backends[i]);
    // A split call merges two partials of its own.
    if (peer == nullptr || peer->compute_ != compute_ || peer->num_q_heads_ != num_q_heads_ ||
        calls[i].q != calls[0].q + row * q_row || calls[i].out != calls[0].out + row * q_row ||
        peer->SplitsCall(calls[i])) {
      return KvBackend::AttendBatch(backends, calls, stats);
    }
    peers.push_back(peer);
    row += calls[i].n;
  }
  std::vector<std::vector<uint8_t*>> staged(calls.size());
  std::vector<uint8_t> any(calls.size(), 0);
  std::vector<LaunchPart> parts;
  for (size_t i = 0; i < calls.size(); ++i) {
    bool staged_any = false;
    RETURN_IF_ERROR(peers[i]->StageFor(calls[i], false, *stats[i], &staged[i], &staged_any));
    any[i] = staged_any;
    parts.push_back({peers[i], &calls[i], &staged[i]});
  }
  ASSIGN_OR_RETURN(PageTable * table, UploadTable(parts));
  RETURN_IF_ERROR(LaunchAttention(parts, *table));
  for (size_t i = 0; i < calls.size(); ++i) {
    RETURN_IF_ERROR(peers[i]->FinishAttend(calls[i], any[i] != 0, false, *stats[i]));
  }
  return absl::OkStatus();
}

absl::Status CudaKvBackend::TakeScores(uint32_t length, std::vector<std::vector<float>>* scores) {
  RETURN_IF_ERROR(EnsureScores(std::max<uint32_t>(length, 1)));
  const uint32_t groups = layout_.geometry.layer_groups;
  scores->resize(groups);
  for (uint32_t grp = 0; grp < groups; ++grp) {
    (*scores)[grp].resize(length);
    float* row = scores_ + uint64_t{grp} * score_capacity_;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync((*scores)[grp].data(), row, length * sizeof(float),
                                                cudaMemcpyDeviceToHost, compute_));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(row, 0, score_capacity_ * sizeof(float), compute_));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
  return absl::OkStatus();
}

absl::Status ValidateForDevice(const TieredKvStoreOptions& o, const codecs::Codec& codec) {
  const layout::KvGeometry& g = o.geometry;
  if (g.head_dim != 64 && g.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.head_dim must be 64 or 128 on the CUDA backend, got ", g.head_dim));
  }
  if (o.num_q_heads == 0 || g.num_kv_heads == 0 || o.num_q_heads % g.num_kv_heads != 0 ||
      o.num_q_heads / g.num_kv_heads > kc::kMaxGqaGroup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_q_heads / geometry.num_kv_heads must be a whole number in [1, ", kc::kMaxGqaGroup,
        "] on the CUDA backend, got ", o.num_q_heads, " / ", g.num_kv_heads));
  }
  // The device writes a layer's codes as encoded K then V: the store's reserved K block must
  // be exactly the encoded size.
  const KvLayout layout{g, &codec};
  const uint64_t key = kc::EncodedBytes(CodecKindOf(codec), kc::Role::kKey, g.page_tokens,
                                        static_cast<uint32_t>(g.ValuesPerTokenLayer()));
  if (layout.ReservedBlockBytes(codecs::TensorRole::kKey) != key) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec \"", std::string(std::string_view(codec.name)),
                     "\" with geometry.page_tokens ", g.page_tokens, " encodes keys in ", key,
                     " bytes, not a multiple of 16: unsupported on "
                     "the CUDA backend"));
  }
  return absl::OkStatus();
}

// Thread-safe: the arena and the pinned registry are; the rest is immutable.
class CudaStoreBackends final : public StoreBackends {
 public:
  CudaStoreBackends(std::unique_ptr<CudaDeviceArena> arena, cudaStream_t stream)
      : arena_(std::move(arena)), stream_(stream) {}
  DeviceArena& arena() override { return *arena_; }
  absl::StatusOr<std::unique_ptr<KvBackend>> MakeBackend(
      const TieredKvStoreOptions& options) override {
    ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(options.codec));
    RETURN_IF_ERROR(ValidateForDevice(options, *codec));
    return std::unique_ptr<KvBackend>(
        new CudaKvBackend(options, codec, stream_, &pinned_, arena_.get()));
  }

 private:
  PinnedPools pinned_;  // outlives no backend: the runtime keeps this object last
  std::unique_ptr<CudaDeviceArena> arena_;
  cudaStream_t stream_;
};

}  // namespace

uint64_t StoreWorkingBytes(const StoreWorkingShape& s) {
  const layout::KvGeometry& g = s.geometry;
  LayerStagerOptions o;
  o.page_tokens = g.page_tokens;
  o.num_kv_heads = g.num_kv_heads;
  o.head_dim = g.head_dim;
  o.dtype = g.element_bytes == 2 ? kc::KvDtype::kBf16 : kc::KvDtype::kF32;
  o.max_offload_batch = kT2ScratchBlocks;
  if (s.t2_codec != nullptr) o.codec = CodecKindOf(*s.t2_codec);
  const bool t2 = s.t2_codec != nullptr;
  // Two slots, regrown to max(needed, twice the last) from 64 entries: below twice the most a
  // layer stages. The resident area: a slot per layer of the schedule's resident pages.
  const uint64_t slot_entries = std::max<uint64_t>(kFirstStagingEntries, 2 * s.staged_pages);
  const uint64_t stager =
      (2 * slot_entries + uint64_t{g.num_layers} * s.resident_pages) * o.SlotEntryBytes(t2) +
      (t2 ? 2 * uint64_t{kT2ScratchBlocks} * o.ScratchEntryBytes() : 0);
  // Launch buffers grow to max(needed, twice the last): below twice the largest need. A
  // prefill is one store's launch of up to max_tokens queries; a batch's launch holds the
  // page tables of every store in it.
  const uint64_t len = s.max_tokens;
  const uint64_t queries = std::max<uint64_t>(s.batch, len);
  const uint64_t rows = std::min<uint64_t>(kMaxBatch, queries);
  const uint64_t table = uint64_t{s.batch} * g.NumPages(len) * sizeof(void*) +
                         queries * (2 * sizeof(int32_t) + sizeof(float*));
  const uint64_t workspace = kc::PagedDecodeWorkspaceBytes(
      static_cast<uint32_t>(rows), static_cast<uint32_t>(len), s.num_q_heads, g.head_dim);
  const uint64_t mass = rows * len * sizeof(float);
  const uint64_t split = 2 * (uint64_t{s.num_q_heads} * (g.head_dim + 1 + len)) * sizeof(float);
  const uint64_t launch = (g.num_layers + 1) * table + workspace + mass + split;
  const uint64_t scores = uint64_t{g.layer_groups} * std::max<uint64_t>(1024, 2 * len) * 4;
  // Each allocation rounded up to the arena's alignment: the tables, workspace, mass, split
  // partials and scores; per staging slot 3 (blocks, T2 codes, pointers), the scratch 4.
  const uint64_t allocations = (g.num_layers + 1) + 4 + 3 * (2 + g.num_layers) + 4;
  return stager + 2 * launch + scores + allocations * kArenaAlignment;
}

absl::StatusOr<std::unique_ptr<StoreBackends>> MakeCudaStoreBackends(uint64_t arena_bytes,
                                                                     void* stream) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceArena> arena, CudaDeviceArena::Create(arena_bytes));
  return std::unique_ptr<StoreBackends>(
      new CudaStoreBackends(std::move(arena), static_cast<cudaStream_t>(stream)));
}

}  // namespace kvtier::worker::cuda
