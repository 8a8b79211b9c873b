#include "worker/cuda/layer_stager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/cuda/cuda_status.h"

namespace kvtier::worker::cuda {

namespace kc = kernels::cuda;

namespace {

// Device-to-host runs cut where the host side crosses a pinned chunk: the host offset plays the
// source role in CoalesceRuns, then the roles are swapped back.
std::vector<CopyRun> CutAtHostChunks(std::vector<CopyRun> runs, uint64_t chunk_bytes) {
  for (CopyRun& r : runs) std::swap(r.src_offset, r.dst_offset);
  runs = CoalesceRuns(runs, chunk_bytes);
  for (CopyRun& r : runs) std::swap(r.src_offset, r.dst_offset);
  return runs;
}

}  // namespace

uint64_t LayerStagerOptions::BlockBytes() const {
  return 2 * uint64_t{page_tokens} * num_kv_heads * head_dim * kc::DtypeBytes(dtype);
}
uint64_t LayerStagerOptions::CompressedKeyBytes() const {
  return kc::EncodedBytes(codec, kc::Role::kKey, page_tokens, num_kv_heads * head_dim);
}
uint64_t LayerStagerOptions::SlotEntryBytes(bool t2) const {
  return BlockBytes() + (t2 ? ScratchEntryBytes() : 0);
}
uint64_t LayerStagerOptions::ScratchEntryBytes() const {
  return CompressedBlockBytes() + 4 * sizeof(void*);
}
uint64_t LayerStagerOptions::CompressedBlockBytes() const {
  return CompressedKeyBytes() +
         kc::EncodedBytes(codec, kc::Role::kValue, page_tokens, num_kv_heads * head_dim);
}

absl::StatusOr<std::unique_ptr<LayerStager>> LayerStager::Create(const LayerStagerOptions& options,
                                                                 PinnedMapping* t1_pool,
                                                                 PinnedMapping* t2_pool) {
  if (t1_pool == nullptr) return absl::InvalidArgumentError("t1_pool is null");
  if (options.page_tokens == 0 || options.num_kv_heads == 0 || options.head_dim == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_tokens, num_kv_heads and head_dim must be > 0, got ",
                     options.page_tokens, ", ", options.num_kv_heads, ", ", options.head_dim));
  }
  if (options.max_offload_batch == 0) {
    return absl::InvalidArgumentError("max_offload_batch must be > 0, got 0");
  }
  absl::StatusOr<StagingPlanner> planner =
      StagingPlanner::Create(options.num_slots, options.entries_per_slot);
  if (!planner.ok()) return planner.status();
  std::unique_ptr<LayerStager> s(new LayerStager(options, t1_pool, t2_pool, *std::move(planner)));
  absl::Status init = s->Init();
  if (!init.ok()) return init;
  return s;
}

absl::Status LayerStager::Init() {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&offloaded_, cudaEventDisableTiming));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&restored_, cudaEventDisableTiming));
  slots_.resize(options_.num_slots);
  for (Slot& slot : slots_) {
    absl::Status s = AllocateSlot(slot, options_.entries_per_slot);
    if (!s.ok()) return s;
  }
  if (t2_ != nullptr) {
    const uint64_t n = options_.max_offload_batch;
    for (Scratch* sc : {&offload_, &restore_}) {
      RETURN_IF_ERROR(
          device_.Allocate(&sc->codes, n * options_.CompressedBlockBytes(), "T2 scratch"));
      RETURN_IF_ERROR(
          device_.Allocate(&sc->ptrs_dev, 4 * n * sizeof(void*), "T2 scratch pointers"));
      KVTIER_CUDA_RETURN_IF_ERROR(PinnedMalloc(&sc->ptrs_host, 4 * n * sizeof(void*)));
    }
  }
  return absl::OkStatus();
}

absl::Status LayerStager::AllocateSlot(Slot& slot, uint64_t entries) {
  RETURN_IF_ERROR(device_.Allocate(&slot.blocks, entries * options_.BlockBytes(), "staging slot"));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming));
  if (t2_ != nullptr) {
    RETURN_IF_ERROR(device_.Allocate(&slot.compressed, entries * options_.CompressedBlockBytes(),
                                     "staging slot's T2 codes"));
    RETURN_IF_ERROR(
        device_.Allocate(&slot.ptrs_dev, 4 * entries * sizeof(void*), "staging pointers"));
    KVTIER_CUDA_RETURN_IF_ERROR(PinnedMalloc(&slot.ptrs_host, 4 * entries * sizeof(void*)));
  }
  return absl::OkStatus();
}

// REQUIRES: no queued copy or launch reads the slot (an arena block is reused at once).
void LayerStager::FreeSlot(Slot& slot) {
  device_.Free(slot.blocks);
  device_.Free(slot.compressed);
  device_.Free(slot.ptrs_dev);
  cudaFreeHost(slot.ptrs_host);
  if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
  if (slot.consumed != nullptr) cudaEventDestroy(slot.consumed);
  slot = Slot{};
}

LayerStager::~LayerStager() {
  if (h2d_ != nullptr) cudaStreamSynchronize(h2d_);
  if (d2h_ != nullptr) cudaStreamSynchronize(d2h_);
  for (Slot& slot : slots_) FreeSlot(slot);
  for (Slot& slot : resident_slots_) FreeSlot(slot);
  FreeScratch(offload_);
  FreeScratch(restore_);
  if (restored_ != nullptr) cudaEventDestroy(restored_);
  if (produced_ != nullptr) cudaEventDestroy(produced_);
  if (offloaded_ != nullptr) cudaEventDestroy(offloaded_);
  if (h2d_ != nullptr) cudaStreamDestroy(h2d_);
  if (d2h_ != nullptr) cudaStreamDestroy(d2h_);
}

void LayerStager::FreeScratch(Scratch& s) {
  device_.Free(s.codes);
  device_.Free(s.ptrs_dev);
  cudaFreeHost(s.ptrs_host);
  for (const auto& [id, e] : s.batches) cudaEventDestroy(e);
  for (cudaEvent_t e : s.spare) cudaEventDestroy(e);
}

absl::StatusOr<LayerStager::ScratchBatch> LayerStager::TakeScratch(Scratch& s, uint32_t n) {
  // Batches seen complete free their entries and events without a wait.
  for (auto it = s.batches.begin(); it != s.batches.end();) {
    const cudaError_t q = cudaEventQuery(it->second);
    if (q == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: cleared, or the next launch would report it
      ++it;
      continue;
    }
    KVTIER_CUDA_RETURN_IF_ERROR(q);
    s.ring.Completed(it->first);
    s.spare.push_back(it->second);
    it = s.batches.erase(it);
  }
  const uint64_t id = s.next_id++;
  const ScratchRing::Reservation r = s.ring.Reserve(n, id);
  for (uint64_t reused : r.reused) {
    auto it = std::find_if(s.batches.begin(), s.batches.end(),
                           [&](const auto& b) { return b.first == reused; });
    if (it == s.batches.end()) continue;
    ++scratch_host_waits_;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(it->second));
    s.spare.push_back(it->second);
    s.batches.erase(it);
  }
  if (s.spare.empty()) {
    cudaEvent_t e = nullptr;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    s.spare.push_back(e);
  }
  const ScratchBatch batch{s.codes + uint64_t{r.first} * options_.CompressedBlockBytes(),
                           s.ptrs_host + 4 * uint64_t{r.first}, s.ptrs_dev + 4 * uint64_t{r.first},
                           s.spare.back()};
  s.spare.pop_back();
  s.batches.emplace_back(id, batch.done);
  return batch;
}

absl::Status LayerStager::EnsureSourcesPinned(absl::Span<const StageRequest> requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const StageRequest& r = requests[i];
    const bool compressed = r.source == StageSource::kCompressed;
    if (compressed && t2_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("requests[", i, "] is compressed but the stager has no T2 pool"));
    }
    const uint64_t limit = compressed ? options_.CompressedBlockBytes() : options_.BlockBytes();
    if (r.src_bytes != limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("requests[", i, "].src_bytes is ", r.src_bytes, ", a block is ", limit));
    }
    absl::Status s = (compressed ? t2_ : t1_)->EnsurePinned(r.src_offset, r.src_bytes);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

bool LayerStager::CanPrefetch(uint32_t layer) const {
  const int64_t held = slots_[planner_.SlotOfLayer(layer)].unreleased_layer;
  return held < 0 || held == static_cast<int64_t>(layer);
}

absl::StatusOr<StagedLayer> LayerStager::Prefetch(uint32_t layer,
                                                  absl::Span<const StageRequest> requests) {
  if (!CanPrefetch(layer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging slot ", planner_.SlotOfLayer(layer), " still holds layer ",
                     slots_[planner_.SlotOfLayer(layer)].unreleased_layer,
                     ", not released; cannot stage layer ", layer));
  }
  return StageInto(planner_, slots_, layer, requests);
}

absl::Status LayerStager::EnsureResident(uint32_t layers, uint32_t entries) {
  if (layers == 0 || entries == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a resident area needs layers and entries > 0, got ", layers, " and ", entries));
  }
  if (layers <= resident_layers() && entries <= resident_entries_) return absl::OkStatus();
  const uint32_t n = std::max(entries, resident_entries_);
  const uint32_t l = std::max(layers, resident_layers());
  // The old blocks may still be read by copies queued on this stream.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(h2d_));
  for (Slot& slot : resident_slots_) FreeSlot(slot);
  resident_slots_.clear();
  resident_entries_ = 0;
  absl::StatusOr<StagingPlanner> planner = StagingPlanner::Create(l, n);
  if (!planner.ok()) return planner.status();
  resident_planner_ = *std::move(planner);
  resident_slots_.resize(l);
  for (Slot& slot : resident_slots_) {
    absl::Status s = AllocateSlot(slot, n);
    if (!s.ok()) return s;
  }
  resident_entries_ = n;
  return absl::OkStatus();
}

absl::StatusOr<StagedLayer> LayerStager::PrefetchResident(uint32_t layer,
                                                          absl::Span<const StageRequest> requests) {
  if (layer >= resident_layers()) {
    return absl::FailedPreconditionError(absl::StrCat("no resident slot for layer ", layer, " (",
                                                      resident_layers(), " resident layers)"));
  }
  return StageInto(resident_planner_, resident_slots_, layer, requests);
}

absl::StatusOr<StagedLayer> LayerStager::StageInto(StagingPlanner& planner,
                                                   std::vector<Slot>& slots, uint32_t layer,
                                                   absl::Span<const StageRequest> requests) {
  absl::Status pinned = EnsureSourcesPinned(requests);
  if (!pinned.ok()) return pinned;
  absl::StatusOr<LayerStagePlan> plan = planner.Plan(layer, requests);
  if (!plan.ok()) return plan.status();
  Slot& slot = slots[plan->slot];
  StagedLayer staged;
  staged.slot = plan->slot;
  staged.reused = plan->reused;
  const uint64_t block = options_.BlockBytes();
  for (uint32_t entry : plan->entry_of_request)
    staged.blocks.push_back(slot.blocks + entry * block);
  // The slot's entries may still be read by the attention that last used it.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d_, slot.consumed, 0));
  const uint64_t calls = h2d_issuer_.calls(), descriptors = h2d_issuer_.descriptors(),
                 batched = h2d_issuer_.batched_calls();
  runs_ = CoalesceFullCopies(plan->copies, block, t1_->chunk_bytes());
  absl::Status s =
      h2d_issuer_.Issue(GroupStrided(runs_, t1_->chunk_bytes()), t1_->base(), slot.blocks, h2d_);
  if (!s.ok()) return s;
  for (const CopyRun& r : runs_) staged.copied_bytes += r.bytes;
  s = DequantizeInto(slot, *plan);
  if (!s.ok()) return s;
  staged.copy_calls = h2d_issuer_.calls() - calls;
  staged.copy_descriptors = h2d_issuer_.descriptors() - descriptors;
  staged.batched_calls = h2d_issuer_.batched_calls() - batched;
  for (const StageCopy& c : plan->copies) {
    if (c.source == StageSource::kCompressed) staged.copied_bytes += c.bytes;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, h2d_));
  slot.copy_pending = true;
  slot.unreleased_layer = layer;
  h2d_bytes_ += staged.copied_bytes;
  return staged;
}

absl::Status LayerStager::DequantizeInto(Slot& slot, const LayerStagePlan& plan) {
  std::vector<const StageCopy*> compressed;
  for (const StageCopy& c : plan.copies) {
    if (c.source == StageSource::kCompressed) compressed.push_back(&c);
  }
  if (compressed.empty()) return absl::OkStatus();
  const uint64_t cbb = options_.CompressedBlockBytes(), ckb = options_.CompressedKeyBytes();
  const uint64_t block = options_.BlockBytes();
  const uint32_t n = static_cast<uint32_t>(compressed.size());
  // The pinned pointer mirror is rewritten only after its previous upload has run.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.copied));
  std::vector<CopyRun> runs;
  for (uint32_t i = 0; i < n; ++i) {
    const StageCopy& c = *compressed[i];
    uint8_t* codes = slot.compressed + c.entry * cbb;
    runs.push_back({c.src_offset, c.entry * cbb, c.bytes});
    uint8_t* out = slot.blocks + c.entry * block;
    slot.ptrs_host[i] = codes;
    slot.ptrs_host[n + i] = codes + ckb;
    slot.ptrs_host[2 * n + i] = out;
    slot.ptrs_host[3 * n + i] = out + block / 2;
  }
  // Codes: one batch of DMAs (pitched where the slots are evenly spaced), cut where the pool's
  // pinned chunks end.
  const uint64_t chunk = t2_->chunk_bytes();
  absl::Status s = h2d_issuer_.Issue(GroupStrided(CoalesceRuns(runs, chunk), chunk), t2_->base(),
                                     slot.compressed, h2d_);
  if (!s.ok()) return s;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.ptrs_dev, slot.ptrs_host, 4 * n * sizeof(void*),
                                              cudaMemcpyHostToDevice, h2d_));
  return DequantizeOnH2d(slot.ptrs_dev, n);
}

absl::Status LayerStager::DequantizeOnH2d(void** ptrs_dev, uint32_t n) {
  kc::DequantizeParams p;
  p.num_tensors = n;
  p.rows = options_.page_tokens;
  p.cols = options_.num_kv_heads * options_.head_dim;
  p.codec = options_.codec;
  p.dst_dtype = options_.dtype;
  for (kc::Role role : {kc::Role::kKey, kc::Role::kValue}) {
    const uint32_t k = role == kc::Role::kKey ? 0 : 1;
    p.role = role;
    p.src = reinterpret_cast<const uint8_t* const*>(ptrs_dev + k * n);
    p.dst = ptrs_dev + (2 + k) * n;
    KVTIER_CUDA_RETURN_IF_ERROR(kc::DequantizePages(p, h2d_));
  }
  return absl::OkStatus();
}

absl::Status LayerStager::Acquire(uint32_t layer, cudaStream_t compute) {
  for (Slot* slot : {&slots_[planner_.SlotOfLayer(layer)],
                     layer < resident_layers() ? &resident_slots_[layer] : nullptr}) {
    if (slot == nullptr || !slot->copy_pending) continue;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, slot->copied, 0));
  }
  return absl::OkStatus();
}

absl::Status LayerStager::Release(uint32_t layer, cudaStream_t compute) {
  Slot& slot = slots_[planner_.SlotOfLayer(layer)];
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.consumed, compute));
  if (slot.unreleased_layer == static_cast<int64_t>(layer)) slot.unreleased_layer = -1;
  if (layer < resident_layers()) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(resident_slots_[layer].consumed, compute));
  }
  return absl::OkStatus();
}

absl::Status LayerStager::Offload(absl::Span<const OffloadOp> ops, cudaStream_t producer) {
  if (ops.empty()) return absl::OkStatus();
  const uint64_t block = options_.BlockBytes();
  for (const OffloadOp& op : ops) {
    absl::Status s = t1_->EnsurePinned(op.dst_offset, block);
    if (!s.ok()) return s;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(produced_, producer));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_, produced_, 0));
  // Device sources are arbitrary pointers: express them as offsets from null.
  runs_.clear();
  for (const OffloadOp& op : ops) {
    runs_.push_back({reinterpret_cast<uint64_t>(op.src), op.dst_offset, block});
  }
  runs_ = CutAtHostChunks(std::move(runs_), t1_->chunk_bytes());
  absl::Status s = d2h_issuer_.Issue(runs_, nullptr, t1_->base(), d2h_);
  if (!s.ok()) return s;
  d2h_bytes_ += block * ops.size();
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(offloaded_, d2h_));
  return absl::OkStatus();
}

absl::Status LayerStager::OffloadCompressed(absl::Span<const OffloadOp> ops,
                                            cudaStream_t producer) {
  if (ops.empty()) return absl::OkStatus();
  if (t2_ == nullptr) return absl::FailedPreconditionError("the stager has no T2 pool");
  const uint64_t cbb = options_.CompressedBlockBytes(), ckb = options_.CompressedKeyBytes();
  const uint64_t block = options_.BlockBytes();
  for (size_t begin = 0; begin < ops.size(); begin += options_.max_offload_batch) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<size_t>(options_.max_offload_batch, ops.size() - begin));
    for (uint32_t i = 0; i < n; ++i) {
      absl::Status s = t2_->EnsurePinned(ops[begin + i].dst_offset, cbb);
      if (!s.ok()) return s;
    }
    absl::StatusOr<ScratchBatch> batch = TakeScratch(offload_, n);
    if (!batch.ok()) return batch.status();
    auto [scratch, ptrs_host, ptrs_dev, done] = *batch;
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t* src = ops[begin + i].src;
      uint8_t* codes = scratch + i * cbb;
      ptrs_host[i] = const_cast<uint8_t*>(src);
      ptrs_host[n + i] = const_cast<uint8_t*>(src + block / 2);
      ptrs_host[2 * n + i] = codes;
      ptrs_host[3 * n + i] = codes + ckb;
    }
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(produced_, producer));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_, produced_, 0));
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ptrs_dev, ptrs_host, 4 * n * sizeof(void*), cudaMemcpyHostToDevice, d2h_));
    kc::QuantizeParams p;
    p.num_tensors = n;
    p.rows = options_.page_tokens;
    p.cols = options_.num_kv_heads * options_.head_dim;
    p.codec = options_.codec;
    p.src_dtype = options_.dtype;
    for (kc::Role role : {kc::Role::kKey, kc::Role::kValue}) {
      const uint32_t k = role == kc::Role::kKey ? 0 : 1;
      p.role = role;
      p.src = ptrs_dev + k * n;
      p.dst = reinterpret_cast<uint8_t* const*>(ptrs_dev + (2 + k) * n);
      KVTIER_CUDA_RETURN_IF_ERROR(kc::QuantizePages(p, d2h_));
    }
    runs_.clear();
    for (uint32_t i = 0; i < n; ++i) runs_.push_back({i * cbb, ops[begin + i].dst_offset, cbb});
    runs_ = CutAtHostChunks(std::move(runs_), t2_->chunk_bytes());
    absl::Status s = d2h_issuer_.Issue(runs_, scratch, t2_->base(), d2h_);
    if (!s.ok()) return s;
    d2h_bytes_ += cbb * n;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, d2h_));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(offloaded_, d2h_));
  }
  return absl::OkStatus();
}

absl::Status LayerStager::Restore(absl::Span<const RestoreOp> ops, cudaStream_t consumer) {
  if (ops.empty()) return absl::OkStatus();
  const uint64_t block = options_.BlockBytes();
  // A source may be host memory an offload is still writing.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d_, offloaded_, 0));
  std::vector<CopyRun> full;
  std::vector<RestoreOp> compressed;
  for (const RestoreOp& op : ops) {
    if (op.source == StageSource::kCompressed) {
      compressed.push_back(op);
      continue;
    }
    absl::Status s = t1_->EnsurePinned(op.src_offset, block);
    if (!s.ok()) return s;
    full.push_back({op.src_offset, reinterpret_cast<uint64_t>(op.dst), block});
  }
  // Device destinations are arbitrary pointers: offsets from null.
  absl::Status s =
      h2d_issuer_.Issue(CoalesceRuns(full, t1_->chunk_bytes()), t1_->base(), nullptr, h2d_);
  if (!s.ok()) return s;
  h2d_bytes_ += block * full.size();
  s = RestoreCompressed(compressed);
  if (!s.ok()) return s;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(restored_, h2d_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(consumer, restored_, 0));
  return absl::OkStatus();
}

absl::Status LayerStager::RestoreCompressed(absl::Span<const RestoreOp> ops) {
  if (ops.empty()) return absl::OkStatus();
  if (t2_ == nullptr) return absl::FailedPreconditionError("the stager has no T2 pool");
  const uint64_t cbb = options_.CompressedBlockBytes(), ckb = options_.CompressedKeyBytes();
  const uint64_t block = options_.BlockBytes();
  for (size_t begin = 0; begin < ops.size(); begin += options_.max_offload_batch) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<size_t>(options_.max_offload_batch, ops.size() - begin));
    for (uint32_t i = 0; i < n; ++i) {
      absl::Status s = t2_->EnsurePinned(ops[begin + i].src_offset, cbb);
      if (!s.ok()) return s;
    }
    absl::StatusOr<ScratchBatch> batch = TakeScratch(restore_, n);
    if (!batch.ok()) return batch.status();
    auto [scratch, ptrs_host, ptrs_dev, done] = *batch;
    std::vector<CopyRun> runs;
    for (uint32_t i = 0; i < n; ++i) {
      runs.push_back({ops[begin + i].src_offset, i * cbb, cbb});
      uint8_t* codes = scratch + i * cbb;
      uint8_t* out = ops[begin + i].dst;
      ptrs_host[i] = codes;
      ptrs_host[n + i] = codes + ckb;
      ptrs_host[2 * n + i] = out;
      ptrs_host[3 * n + i] = out + block / 2;
    }
    absl::Status s =
        h2d_issuer_.Issue(CoalesceRuns(runs, t2_->chunk_bytes()), t2_->base(), scratch, h2d_);
    if (!s.ok()) return s;
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ptrs_dev, ptrs_host, 4 * n * sizeof(void*), cudaMemcpyHostToDevice, h2d_));
    s = DequantizeOnH2d(ptrs_dev, n);
    if (!s.ok()) return s;
    h2d_bytes_ += cbb * n;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, h2d_));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(restored_, h2d_));
  }
  return absl::OkStatus();
}

absl::Status LayerStager::WaitOffloads() {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(offloaded_));
  return absl::OkStatus();
}

}  // namespace kvtier::worker::cuda
