#include "worker/cuda/gpu_decoder.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/cuda/cublas_status.h"
#include "worker/cuda/cuda_kv_backend.h"
#include "worker/cuda/cuda_status.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::worker::cuda {

namespace kc = kernels::cuda;
using tiering::Tier;

namespace {

// Seed of the context chain's K (role 0) or V (role 1) of (sequence, layer).
uint64_t KvSeed(uint64_t seed, uint64_t seq, uint64_t layer, uint64_t role) {
  return seed * 0x100000001B3ull + (seq << 32) + (layer << 1) + role;
}

AttentionShape ShapeOf(const SyntheticModelConfig& m) {
  return {.num_layers = m.num_layers,
          .num_q_heads = m.num_q_heads,
          .num_kv_heads = m.num_kv_heads,
          .head_dim = m.head_dim,
          .scale = 1.f / std::sqrt(static_cast<float>(m.head_dim))};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuDecoder>> GpuDecoder::Create(const SyntheticModel& model,
                                                               const DecoderOptions& options) {
  ASSIGN_OR_RETURN(DecoderConfig config, MakeDecoderConfig(ShapeOf(model.config()), options));
  // The HBM budget holds the stores' working memory too (staging for every page of a
  // sequence at worst, the batch's attention launch, the T2 scratch of the local T2 pool):
  // added to the T0 pages.
  ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(config.runtime.codec));
  const StoreWorkingShape working{
      .geometry = config.geometry,
      .num_q_heads = model.config().num_q_heads,
      .max_tokens = uint64_t{options.context_tokens} + options.max_new_tokens,
      .staged_pages = config.pages_per_sequence,
      .batch = options.batch,
      .t2_codec = codec};
  config.runtime.arena_bytes += uint64_t{options.batch} * StoreWorkingBytes(working);
  std::unique_ptr<GpuDecoder> d(new GpuDecoder(model, options, std::move(config)));
  RETURN_IF_ERROR(d->Init());
  return d;
}

GpuDecoder::~GpuDecoder() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  sequences_.clear();
  runtime_.reset();  // its backends use the stream
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  for (void* p : std::initializer_list<void*>{positions_dev_, tokens_dev_, x_, xn_, qkv_, q_, k_,
                                              v_, attn_, tmp_, gu_, logits_}) {
    cudaFree(p);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status GpuDecoder::Init() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device");
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  config_.runtime.cuda_stream = stream_;
  ASSIGN_OR_RETURN(runtime_, WorkerRuntime::Create(config_.runtime));
  for (uint32_t b = 0; b < options_.batch; ++b) {
    ASSIGN_OR_RETURN(std::unique_ptr<TieredSequence> seq, runtime_->Open(config_.sequence));
    batch_.push_back(seq.get());
    sequences_.push_back(std::move(seq));
  }
  RETURN_IF_ERROR(AllocateBuffers());
  RETURN_IF_ERROR(FillContext());
  return CudaStatus(cudaStreamSynchronize(stream_), "decoder set-up");
}

absl::Status GpuDecoder::AllocateBuffers() {
  const SyntheticModelConfig& m = model_.config();
  const uint64_t b = options_.batch;
  const uint64_t q_dim = uint64_t{m.num_q_heads} * m.head_dim;
  const uint64_t kv_dim = uint64_t{m.num_kv_heads} * m.head_dim;
  const uint64_t widest = std::max<uint64_t>({m.hidden, m.ffn, q_dim});
  const uint64_t kv_rows = std::max<uint64_t>(b, options_.context_tokens);
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&positions_dev_, b * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&tokens_dev_, b * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&x_, b * m.hidden * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&xn_, b * widest * sizeof(uint16_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&qkv_, b * m.QkvRows() * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&q_, b * q_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&k_, kv_rows * kv_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&v_, kv_rows * kv_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&attn_, b * q_dim * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&tmp_, b * m.hidden * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&gu_, b * 2 * m.ffn * sizeof(float)));
  KVTIER_CUDA_RETURN_IF_ERROR(DeviceMalloc(&logits_, b * m.vocab * sizeof(float)));
  std::vector<int32_t> pos(b), tok(b);
  for (uint64_t i = 0; i < b; ++i) {
    pos[i] = static_cast<int32_t>(options_.context_tokens);
    tok[i] = static_cast<int32_t>((i * 7919 + 13) % m.vocab);
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(positions_dev_, pos.data(), b * 4, cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(tokens_dev_, tok.data(), b * 4, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// Every (sequence, layer) gets hash-filled K and V from its own seeds: the same values in every
// mode. Appended in one call each, so the chain lands in T0 pages of the store.
absl::Status GpuDecoder::FillContext() {
  const SyntheticModelConfig& m = model_.config();
  const uint32_t n = options_.context_tokens;
  const uint64_t values = uint64_t{n} * m.num_kv_heads * m.head_dim;
  for (uint32_t b = 0; b < options_.batch; ++b) {
    for (uint32_t l = 0; l < m.num_layers; ++l) {
      const uint64_t seed = options_.kv_seed;
      KVTIER_CUDA_RETURN_IF_ERROR(kc::FillHashF32(k_, values, KvSeed(seed, b, l, 0), 1.f, stream_));
      KVTIER_CUDA_RETURN_IF_ERROR(kc::FillHashF32(v_, values, KvSeed(seed, b, l, 1), 1.f, stream_));
      RETURN_IF_ERROR(sequences_[b]->Append(l, k_, v_, n));
    }
  }
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

absl::Status GpuDecoder::Layer(uint32_t l) {
  const SyntheticModelConfig& m = model_.config();
  const LayerWeights& w = model_.layer(l);
  const uint32_t b = options_.batch, q_dim = m.num_q_heads * m.head_dim;
  const uint32_t kv_dim = m.num_kv_heads * m.head_dim;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RmsNorm(x_, w.attn_norm, b, m.hidden, m.rms_eps, xn_, stream_));
  RETURN_IF_ERROR(Gemm(w.w_qkv, m.QkvRows(), m.hidden, xn_, qkv_));
  kc::RopeAppendParams rope;
  rope.qkv = qkv_;
  rope.positions = positions_dev_;
  rope.q_out = q_;
  rope.k_out = k_;
  rope.v_out = v_;
  rope.batch = b;
  rope.num_q_heads = m.num_q_heads;
  rope.num_kv_heads = m.num_kv_heads;
  rope.head_dim = m.head_dim;
  rope.rope_base = m.rope_base;
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RopeAppend(rope, stream_));
  for (uint32_t s = 0; s < b; ++s) {
    RETURN_IF_ERROR(
        sequences_[s]->Append(l, k_ + uint64_t{s} * kv_dim, v_ + uint64_t{s} * kv_dim, 1));
  }
  // One attention launch for the batch; the last layer ends each sequence's forward pass (and,
  // on a re-tiering step, applies its plan).
  RETURN_IF_ERROR(TieredSequence::AttendBatch(batch_, l, q_, attn_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::CastF32ToBf16(attn_, uint64_t{b} * q_dim, xn_, stream_));
  RETURN_IF_ERROR(Gemm(w.w_o, m.hidden, q_dim, xn_, tmp_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AddInPlace(x_, tmp_, uint64_t{b} * m.hidden, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::RmsNorm(x_, w.mlp_norm, b, m.hidden, m.rms_eps, xn_, stream_));
  RETURN_IF_ERROR(Gemm(w.w_gate_up, 2 * m.ffn, m.hidden, xn_, gu_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::SwiGlu(gu_, b, m.ffn, xn_, stream_));
  RETURN_IF_ERROR(Gemm(w.w_down, m.hidden, m.ffn, xn_, tmp_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AddInPlace(x_, tmp_, uint64_t{b} * m.hidden, stream_));
  return absl::OkStatus();
}

GpuDecoder::Staging GpuDecoder::StagingTotals() const {
  Staging t;
  for (const auto& s : sequences_) {
    const StoreStats& st = s->store().stats();
    t.bytes += st.staged_h2d_bytes;
    t.calls += st.staged_copy_calls;
    t.descriptors += st.staged_copy_descriptors;
    t.batched += st.staged_batched_calls;
  }
  return t;
}

absl::Status GpuDecoder::Step() {
  if (steps_ >= options_.max_new_tokens) {
    return absl::OutOfRangeError(
        absl::StrCat("the cache is sized for ", options_.max_new_tokens, " steps"));
  }
  const SyntheticModelConfig& m = model_.config();
  const uint32_t b = options_.batch;
  const Staging before = StagingTotals();
  KVTIER_CUDA_RETURN_IF_ERROR(
      kc::EmbedTokens(model_.embedding(), tokens_dev_, b, m.hidden, x_, stream_));
  for (uint32_t l = 0; l < m.num_layers; ++l) RETURN_IF_ERROR(Layer(l));
  KVTIER_CUDA_RETURN_IF_ERROR(
      kc::RmsNorm(x_, model_.final_norm(), b, m.hidden, m.rms_eps, xn_, stream_));
  RETURN_IF_ERROR(Gemm(model_.lm_head(), m.vocab, m.hidden, xn_, logits_));
  KVTIER_CUDA_RETURN_IF_ERROR(kc::ArgmaxRows(logits_, b, m.vocab, tokens_dev_, stream_));
  // The store keeps the lengths.
  KVTIER_CUDA_RETURN_IF_ERROR(kc::AdvancePositions(positions_dev_, nullptr, b, stream_));
  const Staging after = StagingTotals();
  last_step_ = {after.bytes - before.bytes, after.calls - before.calls,
                after.descriptors - before.descriptors, after.batched - before.batched};
  ++steps_;
  return absl::OkStatus();
}

absl::Status GpuDecoder::Sync() {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

DecoderStats GpuDecoder::stats() const {
  DecoderStats s;
  for (const auto& seq : sequences_) {
    const TieredKvStore& store = seq->store();
    const tiering::Placement p = store.placement();
    for (Tier t : p.tiers) {
      s.t0_pages += t == Tier::kT0;
      s.t1_pages += t == Tier::kT1;
      s.evicted_pages += t == Tier::kT3;
    }
    const StoreStats& st = store.stats();
    s.offload_d2h_bytes += st.move_bytes[static_cast<int>(Tier::kT0)][static_cast<int>(Tier::kT1)];
    s.promote_h2d_bytes += st.move_bytes[static_cast<int>(Tier::kT1)][static_cast<int>(Tier::kT0)];
    s.plans += st.plans_applied;
  }
  s.t1_pool_bytes = s.t1_pages * config_.page_bytes;
  s.arena_bytes = runtime_->arena().used_bytes();
  s.last_step_h2d_bytes = last_step_.bytes;
  s.last_step_copy_calls = last_step_.calls;
  s.last_step_copy_descriptors = last_step_.descriptors;
  s.batched_calls = StagingTotals().batched;
  return s;
}

absl::Status GpuDecoder::ReadLogits(std::vector<float>* out) {
  out->resize(uint64_t{options_.batch} * model_.config().vocab);
  RETURN_IF_ERROR(Sync());
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), logits_, out->size() * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status GpuDecoder::ReadTokens(std::vector<int32_t>* out) {
  out->resize(options_.batch);
  RETURN_IF_ERROR(Sync());
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out->data(), tokens_dev_, out->size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

}  // namespace kvtier::worker::cuda
