#include "engine/cuda/cuda_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"
#include "engine/cuda/llama_kernels.h"
#include "worker/cuda/cublas_status.h"
#include "worker/cuda/cuda_status.h"
#include "worker/kernels/cuda/model_ops.h"

namespace kvtier::engine::cuda {
namespace {

namespace wk = ::kvtier::worker::kernels::cuda;

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Carves consecutive 256-byte-aligned regions out of one allocation.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(size_t n) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += Align(n * sizeof(T));
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const Model& model,
                                                             const CudaModelOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky error of a failed probe
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: ",
        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0 devices"));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CudaModelOptions.device %d: this machine has %d CUDA devices", options.device, count));
  }
  ASSIGN_OR_RETURN(HostWeights weights, DequantizeWeights(model));
  auto m = std::unique_ptr<CudaModel>(new CudaModel(model));
  RETURN_IF_ERROR(m->Init(options));
  RETURN_IF_ERROR(m->Upload(weights));
  return m;
}

CudaModel::~CudaModel() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cudaFree(workspace_block_);
  cudaFreeHost(host_ids_);
  cudaFreeHost(host_logits_);
  for (void* p : allocations_) cudaFree(p);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaModel::Init(const CudaModelOptions& options) {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  KVTIER_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  return absl::OkStatus();
}

absl::StatusOr<CudaModel::Matrix> CudaModel::UploadMatrix(const HalfMatrix& m) {
  const size_t bytes = m.values.size() * sizeof(uint16_t);
  void* p = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  allocations_.push_back(p);
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(p, m.values.data(), bytes, cudaMemcpyHostToDevice));
  weight_bytes_ += bytes;
  return Matrix{static_cast<const uint16_t*>(p), static_cast<uint32_t>(m.rows),
                static_cast<uint32_t>(m.cols)};
}

absl::StatusOr<const float*> CudaModel::UploadFloats(const std::vector<float>& v) {
  void* p = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, v.size() * sizeof(float)));
  allocations_.push_back(p);
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  weight_bytes_ += v.size() * sizeof(float);
  return static_cast<const float*>(p);
}

absl::Status CudaModel::Upload(const HostWeights& w) {
  ASSIGN_OR_RETURN(token_embd_, UploadMatrix(w.token_embd));
  output_ = token_embd_;
  if (!model_.config().tied_embeddings) {
    ASSIGN_OR_RETURN(output_, UploadMatrix(w.output));
  }
  ASSIGN_OR_RETURN(output_norm_, UploadFloats(w.output_norm));
  for (const HostLayerWeights& hl : w.layers) {
    Layer L;
    ASSIGN_OR_RETURN(L.attn_norm, UploadFloats(hl.attn_norm));
    ASSIGN_OR_RETURN(L.ffn_norm, UploadFloats(hl.ffn_norm));
    ASSIGN_OR_RETURN(L.qkv, UploadMatrix(hl.qkv));
    ASSIGN_OR_RETURN(L.wo, UploadMatrix(hl.wo));
    ASSIGN_OR_RETURN(L.gate_up, UploadMatrix(hl.gate_up));
    ASSIGN_OR_RETURN(L.down, UploadMatrix(hl.down));
    layers_.push_back(L);
  }
  const std::span<const double> inv_freq = model_.rope_inv_freq();
  void* p = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, inv_freq.size_bytes()));
  allocations_.push_back(p);
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(p, inv_freq.data(), inv_freq.size_bytes(), cudaMemcpyHostToDevice));
  inv_freq_ = static_cast<const double*>(p);
  return absl::OkStatus();
}

absl::Status CudaModel::Reserve(size_t tokens, size_t rows) {
  if (tokens <= workspace_tokens_ && rows <= workspace_rows_) return absl::OkStatus();
  tokens = std::max(tokens, workspace_tokens_);
  rows = std::max(rows, workspace_rows_);
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the old buffers are idle
  cudaFree(workspace_block_);
  cudaFreeHost(host_ids_);
  cudaFreeHost(host_logits_);
  workspace_block_ = nullptr;
  host_ids_ = nullptr;
  host_logits_ = nullptr;
  workspace_tokens_ = workspace_rows_ = 0;
  const ModelConfig& c = model_.config();
  const size_t H = c.hidden, qd = size_t{c.num_heads} * c.head_dim;
  const size_t kvd = size_t{c.num_kv_heads} * c.head_dim, F = c.ffn, V = c.vocab_size;
  const size_t widest = std::max({H, qd, F});
  auto carve = [&](Carver& cv) {
    Workspace w;
    w.tokens = cv.Take<int32_t>(tokens);
    w.positions = cv.Take<int32_t>(tokens);
    w.x = cv.Take<float>(tokens * H);
    w.qkv = cv.Take<float>(tokens * (qd + 2 * kvd));
    w.q = cv.Take<float>(tokens * qd);
    w.k = cv.Take<float>(tokens * kvd);
    w.v = cv.Take<float>(tokens * kvd);
    w.att = cv.Take<float>(tokens * qd);
    w.tmp = cv.Take<float>(tokens * H);
    w.gu = cv.Take<float>(tokens * 2 * F);
    w.logits = cv.Take<float>(rows * V);
    w.xh = cv.Take<uint16_t>(tokens * widest);
    w.last = cv.Take<uint16_t>(rows * H);
    return w;
  };
  Carver sizing(nullptr);
  carve(sizing);
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_block_, sizing.used()));
  Carver real(workspace_block_);
  ws_ = carve(real);
  KVTIER_CUDA_RETURN_IF_ERROR(worker::cuda::PinnedMalloc(&host_ids_, 2 * tokens * sizeof(int32_t)));
  KVTIER_CUDA_RETURN_IF_ERROR(worker::cuda::PinnedMalloc(&host_logits_, rows * V * sizeof(float)));
  workspace_tokens_ = tokens;
  workspace_rows_ = rows;
  return absl::OkStatus();
}

absl::Status CudaModel::Gemm(const Matrix& w, const uint16_t* x, size_t n, float* y) {
  // Row-major y[n][rows] = x[n][cols] · w[rows][cols]ᵀ, i.e. column-major yᵀ = wᵀ·xᵀ.
  const float one = 1.f, zero = 0.f;
  KVTIER_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(n),
                   static_cast<int>(w.cols), &one, w.data, CUDA_R_16F, static_cast<int>(w.cols), x,
                   CUDA_R_16F, static_cast<int>(w.cols), &zero, y, CUDA_R_32F,
                   static_cast<int>(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaModel::Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                                std::vector<float>* last_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: tokens is empty");
  const Segment s{tokens, &cache, last_logits};
  return Forward(std::span<const Segment>(&s, 1));
}

absl::Status CudaModel::Decode(std::span<const DecodeRequest> batch) {
  RETURN_IF_ERROR(CheckDecodeBatch(batch));
  std::vector<Segment> segments;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].position_mass != nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Decode: batch[%d].position_mass must be null on cuda (the store scores on the device)",
          i));
    }
    segments.push_back(
        {std::span<const int32_t>(&batch[i].token, 1), batch[i].cache, batch[i].logits});
  }
  return Forward(segments);
}

absl::Status CudaModel::Attention(uint32_t l, std::span<const Segment> segments,
                                  std::span<const uint32_t> starts) {
  const ModelConfig& c = model_.config();
  const size_t qd = size_t{c.num_heads} * c.head_dim, kvd = size_t{c.num_kv_heads} * c.head_dim;
  size_t off = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    const uint32_t n = static_cast<uint32_t>(seg.tokens.size());
    RETURN_IF_ERROR(CheckLayerLength(*seg.cache, l, starts[s], s));
    RETURN_IF_ERROR(seg.cache->Append(l, ws_.k + off * kvd, ws_.v + off * kvd, n));
    RETURN_IF_ERROR(seg.cache->Attend(l, ws_.q + off * qd, n, ws_.att + off * qd, nullptr));
    off += n;
  }
  return absl::OkStatus();
}

absl::Status CudaModel::RunLayer(uint32_t l, std::span<const Segment> segments,
                                 std::span<const uint32_t> starts, size_t total) {
  const ModelConfig& c = model_.config();
  const Layer& L = layers_[l];
  const uint32_t n = static_cast<uint32_t>(total);
  const size_t qd = size_t{c.num_heads} * c.head_dim;
  KVTIER_CUDA_RETURN_IF_ERROR(
      RmsNormHalf(ws_.x, L.attn_norm, n, c.hidden, c.rms_eps, ws_.xh, stream_));
  RETURN_IF_ERROR(Gemm(L.qkv, ws_.xh, total, ws_.qkv));
  KVTIER_CUDA_RETURN_IF_ERROR(SplitRope({.qkv = ws_.qkv,
                                         .positions = ws_.positions,
                                         .inv_freq = inv_freq_,
                                         .q = ws_.q,
                                         .k = ws_.k,
                                         .v = ws_.v,
                                         .tokens = n,
                                         .num_q_heads = c.num_heads,
                                         .num_kv_heads = c.num_kv_heads,
                                         .head_dim = c.head_dim},
                                        stream_));
  RETURN_IF_ERROR(Attention(l, segments, starts));
  KVTIER_CUDA_RETURN_IF_ERROR(CastHalf(ws_.att, total * qd, ws_.xh, stream_));
  RETURN_IF_ERROR(Gemm(L.wo, ws_.xh, total, ws_.tmp));
  KVTIER_CUDA_RETURN_IF_ERROR(wk::AddInPlace(ws_.x, ws_.tmp, total * c.hidden, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(
      RmsNormHalf(ws_.x, L.ffn_norm, n, c.hidden, c.rms_eps, ws_.xh, stream_));
  RETURN_IF_ERROR(Gemm(L.gate_up, ws_.xh, total, ws_.gu));
  KVTIER_CUDA_RETURN_IF_ERROR(SwiGluHalf(ws_.gu, n, c.ffn, ws_.xh, stream_));
  RETURN_IF_ERROR(Gemm(L.down, ws_.xh, total, ws_.tmp));
  KVTIER_CUDA_RETURN_IF_ERROR(wk::AddInPlace(ws_.x, ws_.tmp, total * c.hidden, stream_));
  return absl::OkStatus();
}

absl::Status CudaModel::Logits(std::span<const Segment> segments) {
  const ModelConfig& c = model_.config();
  size_t rows = 0, end = 0;
  for (const Segment& seg : segments) {
    end += seg.tokens.size();
    if (seg.logits == nullptr) continue;
    KVTIER_CUDA_RETURN_IF_ERROR(RmsNormHalf(ws_.x + (end - 1) * c.hidden, output_norm_, 1, c.hidden,
                                            c.rms_eps, ws_.last + rows * c.hidden, stream_));
    ++rows;
  }
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Gemm(output_, ws_.last, rows, ws_.logits));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_logits_, ws_.logits,
                                              rows * c.vocab_size * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

absl::Status CudaModel::Forward(std::span<const Segment> segments) {
  const ModelConfig& c = model_.config();
  std::vector<uint32_t> starts;
  size_t total = 0, wanted = 0;
  for (const Segment& seg : segments) {
    starts.push_back(seg.cache->Length(0));
    RETURN_IF_ERROR(CheckPass(c, starts.back(), seg.tokens));
    total += seg.tokens.size();
    wanted += seg.logits != nullptr;
  }
  if (total == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Reserve(total, std::max<size_t>(wanted, 1)));
  int32_t* ids = host_ids_;
  int32_t* positions = host_ids_ + total;
  size_t t = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (size_t i = 0; i < segments[s].tokens.size(); ++i, ++t) {
      ids[t] = segments[s].tokens[i];
      positions[t] = static_cast<int32_t>(starts[s] + i);
    }
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(ws_.tokens, ids, total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ws_.positions, positions, total * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(EmbedHalf(token_embd_.data, ws_.tokens, static_cast<uint32_t>(total),
                                        c.hidden, ws_.x, stream_));
  for (uint32_t l = 0; l < c.num_layers; ++l) RETURN_IF_ERROR(RunLayer(l, segments, starts, total));
  RETURN_IF_ERROR(Logits(segments));
  // The one host synchronization of a pass: the logits (and the pinned ids, reused next pass).
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  size_t r = 0;
  for (const Segment& seg : segments) {
    if (seg.logits == nullptr) continue;
    const float* src = host_logits_ + r++ * c.vocab_size;
    seg.logits->assign(src, src + c.vocab_size);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::engine::cuda
