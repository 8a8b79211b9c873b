#include "worker/cuda/gpu_decoder.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cublas_status.h"
#include "worker/cuda/cuda_status.h"
#include "worker/kernels/cuda/model_ops.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::cuda {

namespace kc = kernels::cuda;

namespace {

uint64_t PageSeed(uint64_t seed, uint64_t seq, uint64_t page) {
  return seed * 0x100000001B3ull + (seq << 32) + page;
}

absl::Status ValidateOptions(const DecoderOptions& o) {
  if (o.batch == 0 || o.batch > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be in [1, 1024], got ", o.batch));
  }
  if (o.context_tokens == 0 || o.max_new_tokens == 0 || o.page_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_tokens, max_new_tokens and page_tokens must be > 0, got ",
                     o.context_tokens, ", ", o.max_new_tokens, ", ", o.page_tokens));
  }
  if (o.staging_slots == 0) return absl::InvalidArgumentError("staging_slots must be > 0, got 0");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PageTier>> PlaceChain(const DecoderOptions& o) {
  const uint32_t pages = (o.context_tokens + o.max_new_tokens + o.page_tokens - 1) / o.page_tokens;
  std::vector<PageTier> tiers(pages, PageTier::kT0);
  if (o.mode == KvMode::kHierarchy) {
    absl::StatusOr<PageSplit> split = SplitPages(o.context_tokens, o.page_tokens, o.split);
    if (!split.ok()) return split.status();
    std::copy(split->tier.begin(), split->tier.end(), tiers.begin());
  }
  return tiers;
}

uint64_t BlockBytesFor(const SyntheticModelConfig& m, uint32_t page_tokens) {
  return 2 * uint64_t{page_tokens} * m.num_kv_heads * m.head_dim * 2;  // bf16 K then V
}

}  // namespace

uint64_t GpuDecoder::BlockBytes() const {
  return BlockBytesFor(model_.config(), options_.page_tokens);
}

absl::StatusOr<uint64_t> GpuDecoder::RequiredPoolBytes(const SyntheticModelConfig& model,
                                                       const DecoderOptions& options) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  absl::StatusOr<std::vector<PageTier>> tiers = PlaceChain(options);
  if (!tiers.ok()) return tiers.status();
  const uint64_t t1 = std::count(tiers->begin(), tiers->end(), PageTier::kT1);
  if (t1 == 0) return 0;
  const uint64_t write_back =
      options.write_back ? tiers->size() - options.context_tokens / options.page_tokens : 0;
  return uint64_t{model.num_layers} * options.batch * (t1 + write_back) *
         BlockBytesFor(model, options.page_tokens);
}

uint64_t GpuDecoder::WriteBackOffset(uint32_t layer, uint32_t b, uint32_t page) const {
  const uint64_t first = options_.context_tokens / options_.page_tokens;
  const uint64_t pages = pages_per_seq_ - first;
  const uint64_t t1_area =
      uint64_t{model_.config().num_layers} * options_.batch * max_t1_pages_ * BlockBytes();
  return t1_area + ((uint64_t{layer} * options_.batch + b) * pages + (page - first)) * BlockBytes();
}

absl::StatusOr<std::unique_ptr<GpuDecoder>> GpuDecoder::Create(const SyntheticModel& model,
                                                               const DecoderOptions& options,
                                                               PinnedMapping* t1_pool) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  std::unique_ptr<GpuDecoder> d(new GpuDecoder(model, options, t1_pool));
  absl::Status s = d->Init();
  if (!s.ok()) return s;
  return d;
}

GpuDecoder::~GpuDecoder() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  stager_.reset();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  for (void* p : std::initializer_list<void*>{tables_dev_, indptr_dev_, positions_dev_,
                                              lengths_dev_, tokens_dev_, x_, xn_, qkv_, q_, attn_,
                                              tmp_, gu_, logits_, mass_, workspace_}) {
    cudaFree(p);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status GpuDecoder::Init() {
  const SyntheticModelConfig& m = model_.config();
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  absl::StatusOr<std::vector<PageTier>> tiers = PlaceChain(options_);
  if (!tiers.ok()) return tiers.status();
  tiers_ = *std::move(tiers);
  pages_per_seq_ = static_cast<uint32_t>(tiers_.size());
  max_t1_pages_ = static_cast<uint32_t>(std::count(tiers_.begin(), tiers_.end(), PageTier::kT1));
  const uint32_t context_pages =
      (options_.context_tokens + options_.page_tokens - 1) / options_.page_tokens;
  for (uint32_t p = 0; p < context_pages; ++p) {
    stats_.t0_pages_per_seq += tiers_[p] == PageTier::kT0;
    stats_.t1_pages_per_seq += tiers_[p] == PageTier::kT1;
    stats_.evicted_pages_per_seq += tiers_[p] == PageTier::kEvicted;
  }
  if (max_t1_pages_ > 0) {
    absl::StatusOr<uint64_t> need_or = RequiredPoolBytes(m, options_);
    if (!need_or.ok()) return need_or.status();
    const uint64_t need = *need_or;
    if (pool_ == nullptr || pool_->size() < need) {
      return absl::InvalidArgumentError(absl::StrCat("t1_pool must hold ", need, " bytes, has ",
                                                     pool_ == nullptr ? 0 : pool_->size()));
    }
    stats_.t1_pool_bytes = need;
    LayerStagerOptions so;
    so.num_slots = options_.staging_slots;
    so.entries_per_slot = options_.batch * max_t1_pages_;
    so.page_tokens = options_.page_tokens;
    so.num_kv_heads = m.num_kv_heads;
    so.head_dim = m.head_dim;
    absl::StatusOr<std::unique_ptr<LayerStager>> stager = LayerStager::Create(so, pool_, nullptr);
    if (!stager.ok()) return stager.status();
    stager_ = *std::move(stager);
  }
  absl::Status s = AllocateBuffers();
  if (s.ok()) s = PlaceAndFillCache();
  if (s.ok()) s = BuildStageRequests();
  if (s.ok()) s = UploadTables();
  // Set-up work ran on several streams (the legacy one included): settle it before Step().
  if (s.ok()) s = CudaStatus(cudaDeviceSynchronize(), "decoder set-up");
  return s;
}

absl::Status GpuDecoder::AllocateBuffers() {
  const SyntheticModelConfig& m = model_.config();
  const uint64_t b = options_.batch, n = b * pages_per_seq_;
  const uint32_t max_len = options_.context_tokens + options_.max_new_tokens;
  const uint64_t q_dim = uint64_t{m.num_q_heads} * m.head_dim;
  const uint64_t widest = std::max<uint64_t>({m.hidden, m.ffn, q_dim});
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&tables_dev_, m.num_layers * n * sizeof(void*)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&indptr_dev_, (b + 1) * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&positions_dev_, b * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&lengths_dev_, b * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&tokens_dev_, b * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&x_, b * m.hidden * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&xn_, b * widest * sizeof(uint16_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&qkv_, b * m.QkvRows() * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&q_, b * q_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&attn_, b * q_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&tmp_, b * m.hidden * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&gu_, b * 2 * m.ffn * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&logits_, b * m.vocab * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&mass_, b * max_len * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemset(mass_, 0, b * max_len * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(
      &workspace_,
      kc::PagedDecodeWorkspaceBytes(options_.batch, max_len, m.num_q_heads, m.head_dim)));
  std::vector<int32_t> indptr(b + 1), pos(b), len(b), tok(b);
  for (uint64_t i = 0; i <= b; ++i) indptr[i] = static_cast<int32_t>(i * pages_per_seq_);
  for (uint64_t i = 0; i < b; ++i) {
    pos[i] = static_cast<int32_t>(options_.context_tokens);
    len[i] = pos[i] + 1;
    tok[i] = static_cast<int32_t>((i * 7919 + 13) % m.vocab);
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(indptr_dev_, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(positions_dev_, pos.data(), b * 4, cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(lengths_dev_, len.data(), b * 4, cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(tokens_dev_, tok.data(), b * 4, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// Every page gets hash-filled KV from a seed of (sequence, page): the same values in every mode.
// T0 pages are filled in the arena; T1 pages in a device scratch, then offloaded block by block
// to their pool slots through the stager's device-to-host path.
absl::Status GpuDecoder::PlaceAndFillCache() {
  const SyntheticModelConfig& m = model_.config();
  const uint64_t block = BlockBytes(), page_bytes = block * m.num_layers;
  const uint64_t t0_pages = std::count(tiers_.begin(), tiers_.end(), PageTier::kT0);
  absl::StatusOr<std::unique_ptr<CudaDeviceArena>> arena =
      CudaDeviceArena::Create(std::max<uint64_t>(options_.batch * t0_pages * page_bytes, 256));
  if (!arena.ok()) return arena.status();
  arena_ = *std::move(arena);
  uint8_t* scratch = nullptr;
  if (max_t1_pages_ > 0) {
    KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&scratch, max_t1_pages_ * page_bytes));
  }
  t0_pages_.assign(uint64_t{options_.batch} * pages_per_seq_, nullptr);
  absl::Status status;
  for (uint32_t b = 0; b < options_.batch && status.ok(); ++b) {
    std::vector<OffloadOp> ops;
    uint32_t k = 0;
    for (uint32_t p = 0; p < pages_per_seq_ && status.ok(); ++p) {
      uint8_t* dst = nullptr;
      if (tiers_[p] == PageTier::kT0) {
        absl::StatusOr<uint8_t*> got = arena_->Allocate(page_bytes);
        if (!got.ok()) {
          status = got.status();
          break;
        }
        dst = t0_pages_[uint64_t{b} * pages_per_seq_ + p] = *got;
      } else if (tiers_[p] == PageTier::kT1) {
        dst = scratch + uint64_t{k} * page_bytes;
        for (uint32_t l = 0; l < m.num_layers; ++l) {
          const uint64_t slot = ((uint64_t{l} * options_.batch + b) * max_t1_pages_ + k) * block;
          ops.push_back({dst + l * block, slot});
        }
        ++k;
      } else {
        continue;
      }
      status = CudaStatus(kc::FillHashBf16(reinterpret_cast<uint16_t*>(dst), page_bytes / 2,
                                           PageSeed(options_.kv_seed, b, p), 1.f, stream_),
                          "filling KV");
    }
    if (status.ok() && !ops.empty()) status = stager_->Offload(ops, stream_);
    if (status.ok() && !ops.empty()) status = stager_->WaitOffloads();
  }
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "filling the cache");
  cudaFree(scratch);
  stats_.arena_bytes = arena_->used_bytes();
  if (stager_ != nullptr) stats_.offload_d2h_bytes = stager_->d2h_bytes();
  return status;
}

absl::Status GpuDecoder::BuildStageRequests() {
  const SyntheticModelConfig& m = model_.config();
  const uint64_t block = BlockBytes(), n = uint64_t{options_.batch} * pages_per_seq_;
  tables_.assign(m.num_layers, std::vector<const void*>(n, nullptr));
  requests_.assign(m.num_layers, {});
  request_index_.assign(m.num_layers, {});
  prefetched_.assign(m.num_layers, false);
  for (uint32_t l = 0; l < m.num_layers; ++l) {
    for (uint32_t b = 0; b < options_.batch; ++b) {
      uint32_t k = 0;
      for (uint32_t p = 0; p < pages_per_seq_; ++p) {
        const uint64_t idx = uint64_t{b} * pages_per_seq_ + p;
        if (tiers_[p] == PageTier::kT0) tables_[l][idx] = t0_pages_[idx] + l * block;
        if (tiers_[p] != PageTier::kT1) continue;
        StageRequest r;
        r.page_id = (uint64_t{b} << 32) | p;
        r.version = 1;
        r.src_offset = ((uint64_t{l} * options_.batch + b) * max_t1_pages_ + k) * block;
        r.src_bytes = block;
        requests_[l].push_back(r);
        request_index_[l].push_back(static_cast<uint32_t>(idx));
        ++k;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuDecoder::UploadTables() {
  const uint64_t n = uint64_t{options_.batch} * pages_per_seq_;
  for (uint32_t l = 0; l < tables_.size(); ++l) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(tables_dev_ + l * n, tables_[l].data(),
                                           n * sizeof(void*), cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

absl::Status GpuDecoder::PrefetchLayer(uint32_t layer) {
  absl::StatusOr<StagedLayer> staged = stager_->Prefetch(layer, requests_[layer]);
  if (!staged.ok()) return staged.status();
  step_h2d_ += staged->copied_bytes;
  bool changed = false;
  std::vector<const void*>& table = tables_[layer];
  for (size_t i = 0; i < staged->blocks.size(); ++i) {
    const uint32_t idx = request_index_[layer][i];
    if (table[idx] != staged->blocks[i]) {
      table[idx] = staged->blocks[i];
      changed = true;
    }
  }
  if (changed) {  // pageable source: the call returns once the bytes are captured
    const uint64_t n = table.size();
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        tables_dev_ + layer * n, table.data(), n * sizeof(void*), cudaMemcpyHostToDevice, stream_));
  }
  prefetched_[layer] = true;
  return absl::OkStatus();
}

absl::Status GpuDecoder::Gemm(const uint16_t* w, uint32_t out, uint32_t in, const uint16_t* x,
                              float* y) {
  const float one = 1.f, zero = 0.f;
  KVTIER_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                   static_cast<int>(options_.batch), static_cast<int>(in), &one, w, CUDA_R_16BF,
                   static_cast<int>(in), x, CUDA_R_16BF, static_cast<int>(in), &zero, y, CUDA_R_32F,
                   static_cast<int>(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

#define KVTIER_RETURN_IF_NOT_OK(expr)      \
  do {                                     \
    const absl::Status kvtier_s_ = (expr); \
    if (!kvtier_s_.ok()) return kvtier_s_; \
  } while (0)

absl::Status GpuDecoder::Layer(uint32_t l) {
  const SyntheticModelConfig& m = model_.config();
  const LayerWeights& w = model_.layer(l);
  const uint32_t b = options_.batch, q_dim = m.num_q_heads * m.head_dim;
  void** table = tables_dev_ + uint64_t{l} * b * pages_per_seq_;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RmsNorm(x_, w.attn_norm, b, m.hidden, m.rms_eps, xn_, stream_));
  KVTIER_RETURN_IF_NOT_OK(Gemm(w.w_qkv, m.QkvRows(), m.hidden, xn_, qkv_));
  kc::RopeAppendParams rope;
  rope.qkv = qkv_;
  rope.positions = positions_dev_;
  rope.q_out = q_;
  rope.pages = table;
  rope.page_indptr = indptr_dev_;
  rope.page_tokens = options_.page_tokens;
  rope.batch = b;
  rope.num_q_heads = m.num_q_heads;
  rope.num_kv_heads = m.num_kv_heads;
  rope.head_dim = m.head_dim;
  rope.rope_base = m.rope_base;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RopeAppend(rope, stream_));
  if (stager_ != nullptr) KVTIER_RETURN_IF_NOT_OK(stager_->Acquire(l, stream_));
  kc::PagedDecodeParams att;
  att.q = q_;
  att.out = attn_;
  att.pages = table;
  att.page_indptr = indptr_dev_;
  att.lengths = lengths_dev_;
  att.position_mass = options_.emit_mass ? mass_ : nullptr;
  att.mass_stride = options_.context_tokens + options_.max_new_tokens;
  att.accumulate_mass = l > 0;
  att.workspace = workspace_;
  att.batch = b;
  att.max_length = att.mass_stride;
  att.num_q_heads = m.num_q_heads;
  att.num_kv_heads = m.num_kv_heads;
  att.head_dim = m.head_dim;
  att.page_tokens = options_.page_tokens;
  att.scale = 1.f / std::sqrt(static_cast<float>(m.head_dim));
  att.kv_dtype = kc::KvDtype::kBf16;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::PagedDecodeAttention(att, stream_));
  if (stager_ != nullptr) {
    KVTIER_RETURN_IF_NOT_OK(stager_->Release(l, stream_));
    prefetched_[l] = false;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(kc::CastF32ToBf16(attn_, uint64_t{b} * q_dim, xn_, stream_));
  KVTIER_RETURN_IF_NOT_OK(Gemm(w.w_o, m.hidden, q_dim, xn_, tmp_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AddInPlace(x_, tmp_, uint64_t{b} * m.hidden, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RmsNorm(x_, w.mlp_norm, b, m.hidden, m.rms_eps, xn_, stream_));
  KVTIER_RETURN_IF_NOT_OK(Gemm(w.w_gate_up, 2 * m.ffn, m.hidden, xn_, gu_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::SwiGlu(gu_, b, m.ffn, xn_, stream_));
  KVTIER_RETURN_IF_NOT_OK(Gemm(w.w_down, m.hidden, m.ffn, xn_, tmp_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AddInPlace(x_, tmp_, uint64_t{b} * m.hidden, stream_));
  return absl::OkStatus();
}

absl::Status GpuDecoder::Step() {
  if (steps_ >= options_.max_new_tokens) {
    return absl::OutOfRangeError(
        absl::StrCat("the cache is sized for ", options_.max_new_tokens, " steps"));
  }
  const SyntheticModelConfig& m = model_.config();
  const uint32_t b = options_.batch;
  step_h2d_ = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(
      kc::EmbedTokens(model_.embedding(), tokens_dev_, b, m.hidden, x_, stream_));
  for (uint32_t l = 0; l < m.num_layers; ++l) {
    if (stager_ != nullptr) {
      // Stage layer l if it could not be staged ahead; then stage the next one (after the last
      // layer: layer 0 of the next step) while this one computes, unless it shares this layer's
      // slot (one slot, or an odd wrap-around): that copy waits until this layer is released.
      if (!prefetched_[l]) KVTIER_RETURN_IF_NOT_OK(PrefetchLayer(l));
      const uint32_t next = (l + 1) % m.num_layers;
      if (!prefetched_[next] && stager_->CanPrefetch(next)) {
        KVTIER_RETURN_IF_NOT_OK(PrefetchLayer(next));
      }
    }
    KVTIER_RETURN_IF_NOT_OK(Layer(l));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      kc::RmsNorm(x_, model_.final_norm(), b, m.hidden, m.rms_eps, xn_, stream_));
  KVTIER_RETURN_IF_NOT_OK(Gemm(model_.lm_head(), m.vocab, m.hidden, xn_, logits_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::ArgmaxRows(logits_, b, m.vocab, tokens_dev_, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AdvancePositions(positions_dev_, lengths_dev_, b, stream_));
  KVTIER_RETURN_IF_NOT_OK(WriteBackFilledPage());
  stats_.last_step_h2d_bytes = step_h2d_;
  ++steps_;
  return absl::OkStatus();
}

// The token of this step sat at position context + steps_; when it completed its page, that
// page's blocks go to the write-back area once this step's work is done, while the next computes.
absl::Status GpuDecoder::WriteBackFilledPage() {
  const uint32_t pos = options_.context_tokens + steps_, pt = options_.page_tokens;
  if (stager_ == nullptr || !options_.write_back || (pos + 1) % pt != 0) return absl::OkStatus();
  const uint32_t page = pos / pt, layers = model_.config().num_layers;
  std::vector<OffloadOp> ops;
  for (uint32_t b = 0; b < options_.batch; ++b) {
    const uint8_t* src = t0_pages_[uint64_t{b} * pages_per_seq_ + page];
    for (uint32_t l = 0; l < layers; ++l) {
      ops.push_back({src + uint64_t{l} * BlockBytes(), WriteBackOffset(l, b, page)});
    }
  }
  KVTIER_RETURN_IF_NOT_OK(stager_->Offload(ops, stream_));
  stats_.write_back_d2h_bytes += ops.size() * BlockBytes();
  return absl::OkStatus();
}

absl::Status GpuDecoder::Sync() {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (stager_ != nullptr) KVTIER_RETURN_IF_NOT_OK(stager_->WaitOffloads());
  return absl::OkStatus();
}

absl::Status GpuDecoder::ReadT0Block(uint32_t b, uint32_t page, uint32_t layer,
                                     std::vector<uint8_t>* out) {
  if (b >= options_.batch || page >= pages_per_seq_ || layer >= model_.config().num_layers ||
      t0_pages_[uint64_t{b} * pages_per_seq_ + page] == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no T0 block for sequence ", b, " page ", page, " layer ", layer));
  }
  out->resize(BlockBytes());
  KVTIER_RETURN_IF_NOT_OK(Sync());
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), t0_pages_[uint64_t{b} * pages_per_seq_ + page] + layer * BlockBytes(),
                 BlockBytes(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status GpuDecoder::ReadLogits(std::vector<float>* out) {
  out->resize(uint64_t{options_.batch} * model_.config().vocab);
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), logits_, out->size() * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status GpuDecoder::ReadTokens(std::vector<int32_t>* out) {
  out->resize(options_.batch);
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), tokens_dev_, out->size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status GpuDecoder::ReadMass(std::vector<float>* out) {
  out->resize(uint64_t{options_.batch} * (options_.context_tokens + options_.max_new_tokens));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), mass_, out->size() * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

}  // namespace kvtier::worker::cuda
