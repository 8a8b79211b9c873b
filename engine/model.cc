#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status/status_macros.h"
#include "engine/model_path.h"

namespace kvtier::engine {
namespace {

// y = x / rms(x) · w over rows of `dim`; the sum of squares in double, as ggml does.
void RmsNorm(const float* x, const float* w, float* y, size_t rows, size_t dim, float eps) {
  for (size_t r = 0; r < rows; ++r, x += dim, y += dim) {
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += double(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (size_t i = 0; i < dim; ++i) y[i] = x[i] * scale * w[i];
  }
}

// Adjacent-pair ("normal", GGUF llama) RoPE: rotates (x[2i], x[2i+1]) of every head by
// pos · inv_freq[i].  x: [tokens][heads][head_dim], cs/sn: [tokens][head_dim / 2].
void Rope(float* x, size_t tokens, size_t heads, size_t head_dim, const float* cs,
          const float* sn) {
  const size_t half = head_dim / 2;
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (size_t i = 0; i < half; ++i) {
        const float c = cs[t * half + i], s = sn[t * half + i];
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

absl::StatusOr<uint32_t> GetU32(const GgufFile& f, const std::string& key) {
  ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v == 0 || v > (1u << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GGUF file '%s': %s = %d out of range", f.path(), key, v));
  }
  return static_cast<uint32_t>(v);
}

}  // namespace

absl::Status CheckPass(const ModelConfig& c, uint32_t cached, std::span<const int32_t> tokens) {
  if (cached + tokens.size() > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sequence of %d cached + %d new tokens exceeds the context length %d",
                        cached, tokens.size(), c.context_length));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= static_cast<int32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d out of vocabulary [0, %d)", t, c.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLayerLength(const worker::AttentionCache& cache, uint32_t layer, uint32_t start,
                              size_t segment) {
  if (cache.Length(layer) == start) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("cache of segment %d has %d positions in layer %d, %d in layer 0", segment,
                      cache.Length(layer), layer, start));
}

absl::Status CheckDecodeBatch(std::span<const DecodeRequest> batch) {
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].cache == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("Decode: batch[%d].cache is null", i));
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].cache == batch[i].cache) {
        return absl::InvalidArgumentError(
            absl::StrFormat("Decode: batch[%d] and batch[%d] share a cache", j, i));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const ModelOptions& options) {
  if (!std::filesystem::exists(path)) return absl::NotFoundError(MissingModelHint(path));
  auto model = std::unique_ptr<Model>(new Model());
  ASSIGN_OR_RETURN(model->file_, GgufFile::Open(path));
  const GgufFile& f = *model->file_;
  ModelConfig& c = model->config_;
  ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': unsupported architecture '%s' (expected 'llama')", path, c.architecture));
  }
  if (f.Find("general.name") != nullptr) c.name = f.GetString("general.name").value_or("");
  ASSIGN_OR_RETURN(c.num_layers, GetU32(f, "llama.block_count"));
  ASSIGN_OR_RETURN(c.hidden, GetU32(f, "llama.embedding_length"));
  ASSIGN_OR_RETURN(c.num_heads, GetU32(f, "llama.attention.head_count"));
  ASSIGN_OR_RETURN(c.num_kv_heads, GetU32(f, "llama.attention.head_count_kv"));
  ASSIGN_OR_RETURN(c.ffn, GetU32(f, "llama.feed_forward_length"));
  ASSIGN_OR_RETURN(c.context_length, GetU32(f, "llama.context_length"));
  ASSIGN_OR_RETURN(double base, f.GetFloat("llama.rope.freq_base"));
  ASSIGN_OR_RETURN(double eps, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  c.rope_base = static_cast<float>(base);
  c.rms_eps = static_cast<float>(eps);
  if (c.hidden % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model '%s': hidden %d, heads %d, kv heads %d are not divisible", path,
                        c.hidden, c.num_heads, c.num_kv_heads));
  }
  c.head_dim = c.hidden / c.num_heads;
  if (f.Find("llama.rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(uint32_t rope_dims, GetU32(f, "llama.rope.dimension_count"));
    if (rope_dims != c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model '%s': partial RoPE (%d of %d dims) is not supported", path,
                          rope_dims, c.head_dim));
    }
  }
  ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::FromGguf(f));
  c.vocab_size = static_cast<uint32_t>(model->tokenizer_->vocab_size());
  RETURN_IF_ERROR(model->BindTensors());
  model->pool_ = std::make_unique<ThreadPool>(options.threads);
  model->isa_ = options.isa.value_or(DetectKernelIsa());
  for (uint32_t i = 0; i < c.head_dim / 2; ++i) {
    model->inv_freq_.push_back(std::pow(double{c.rope_base}, -2.0 * i / c.head_dim));
  }
  return model;
}

absl::Status Model::BindTensors() {
  const GgufFile& f = *file_;
  auto matrix = [&](const std::string& name, size_t cols,
                    size_t rows) -> absl::StatusOr<WeightMatrix> {
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model '%s': tensor '%s' is missing", f.path(), name));
    }
    if (t->ne.size() != 2 || t->ne[0] != cols || t->ne[1] != rows) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model '%s': tensor '%s' has shape [%s], expected [%d, %d]", f.path(),
                          name, absl::StrJoin(t->ne, ", "), cols, rows));
    }
    return WeightMatrix{t->type, t->data, rows, cols, t->num_bytes / rows};
  };
  auto vec = [&](const std::string& name, size_t n) -> absl::StatusOr<std::span<const float>> {
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr || t->type != GgmlType::kF32 || t->num_elements != n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model '%s': tensor '%s' missing or not f32[%d]", f.path(), name, n));
    }
    return std::span<const float>(reinterpret_cast<const float*>(t->data), n);
  };
  const ModelConfig& c = config_;
  const size_t kv = size_t{c.num_kv_heads} * c.head_dim;
  ASSIGN_OR_RETURN(token_embd_, matrix("token_embd.weight", c.hidden, c.vocab_size));
  ASSIGN_OR_RETURN(output_norm_, vec("output_norm.weight", c.hidden));
  config_.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  if (config_.tied_embeddings) {
    output_ = token_embd_;
  } else {
    ASSIGN_OR_RETURN(output_, matrix("output.weight", c.hidden, c.vocab_size));
  }
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    Layer L;
    ASSIGN_OR_RETURN(L.attn_norm, vec(p + "attn_norm.weight", c.hidden));
    ASSIGN_OR_RETURN(L.ffn_norm, vec(p + "ffn_norm.weight", c.hidden));
    ASSIGN_OR_RETURN(L.wq, matrix(p + "attn_q.weight", c.hidden, c.hidden));
    ASSIGN_OR_RETURN(L.wk, matrix(p + "attn_k.weight", c.hidden, kv));
    ASSIGN_OR_RETURN(L.wv, matrix(p + "attn_v.weight", c.hidden, kv));
    ASSIGN_OR_RETURN(L.wo, matrix(p + "attn_output.weight", c.hidden, c.hidden));
    ASSIGN_OR_RETURN(L.gate, matrix(p + "ffn_gate.weight", c.hidden, c.ffn));
    ASSIGN_OR_RETURN(L.up, matrix(p + "ffn_up.weight", c.hidden, c.ffn));
    ASSIGN_OR_RETURN(L.down, matrix(p + "ffn_down.weight", c.ffn, c.hidden));
    layers_.push_back(L);
  }
  return absl::OkStatus();
}

worker::AttentionShape Model::attention_shape() const {
  return worker::AttentionShape{config_.num_layers, config_.num_heads, config_.num_kv_heads,
                                config_.head_dim,
                                1.0f / std::sqrt(static_cast<float>(config_.head_dim))};
}

absl::Status Model::Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                            std::vector<float>* last_logits, std::vector<float>* position_mass) {
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: tokens is empty");
  Segment s{tokens, &cache, last_logits, position_mass};
  return Forward(std::span<const Segment>(&s, 1));
}

absl::Status Model::Decode(std::span<const DecodeRequest> batch) {
  RETURN_IF_ERROR(CheckDecodeBatch(batch));
  std::vector<Segment> segs;
  segs.reserve(batch.size());
  for (const DecodeRequest& r : batch) {
    segs.push_back({std::span<const int32_t>(&r.token, 1), r.cache, r.logits, r.position_mass});
  }
  return Forward(segs);
}

absl::Status Model::RunAttention(uint32_t layer, std::span<const Segment> segments,
                                 const std::vector<uint32_t>& starts, const float* q,
                                 const float* k, const float* v, float* out,
                                 std::vector<float>& mass) {
  const ModelConfig& c = config_;
  const size_t qd = size_t{c.num_heads} * c.head_dim, kvd = size_t{c.num_kv_heads} * c.head_dim;
  size_t off = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    const uint32_t n = static_cast<uint32_t>(seg.tokens.size());
    RETURN_IF_ERROR(CheckLayerLength(*seg.cache, layer, starts[s], s));
    RETURN_IF_ERROR(seg.cache->Append(layer, k + off * kvd, v + off * kvd, n));
    const uint32_t len = starts[s] + n;
    float* m = nullptr;
    if (seg.position_mass != nullptr) {
      mass.assign(len, 0.f);
      m = mass.data();
      if (layer == 0) seg.position_mass->assign(len, 0.f);
    }
    seg.cache->SetTaskRunner(pool_.get());
    const absl::Status attended = seg.cache->Attend(layer, q + off * qd, n, out + off * qd, m);
    seg.cache->SetTaskRunner(nullptr);
    RETURN_IF_ERROR(attended);
    if (m != nullptr) {
      const float w = 1.f / (float(c.num_layers) * c.num_heads);
      for (uint32_t j = 0; j < len; ++j) (*seg.position_mass)[j] += w * m[j];
    }
    off += n;
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const Segment> segments) {
  const ModelConfig& c = config_;
  size_t total = 0;
  std::vector<uint32_t> starts;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    starts.push_back(seg.cache->Length(0));
    RETURN_IF_ERROR(CheckPass(c, starts.back(), seg.tokens));
    total += seg.tokens.size();
  }
  if (total == 0) return absl::OkStatus();
  const size_t H = c.hidden, hd = c.head_dim, half = hd / 2;
  const size_t qd = size_t{c.num_heads} * hd, kvd = size_t{c.num_kv_heads} * hd;
  std::vector<float> x(total * H), xn(total * H), q(total * qd), k(total * kvd), v(total * kvd),
      att(total * qd), tmp(total * H), g(total * c.ffn), u(total * c.ffn);
  std::vector<float> cs(total * half), sn(total * half), mass;
  size_t t = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (size_t i = 0; i < segments[s].tokens.size(); ++i, ++t) {
      const int32_t id = segments[s].tokens[i];
      DequantizeRow(token_embd_.type, token_embd_.Row(id), x.data() + t * H, H);
      const double pos = starts[s] + i;
      for (size_t j = 0; j < half; ++j) {
        cs[t * half + j] = static_cast<float>(std::cos(pos * inv_freq_[j]));
        sn[t * half + j] = static_cast<float>(std::sin(pos * inv_freq_[j]));
      }
    }
  }
  ThreadPool& pool = *pool_;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    RmsNorm(x.data(), L.attn_norm.data(), xn.data(), total, H, c.rms_eps);
    const MatMulOutput qkv[] = {{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}};
    MatMulShared(qkv, xn.data(), total, pool, isa_);
    Rope(q.data(), total, c.num_heads, hd, cs.data(), sn.data());
    Rope(k.data(), total, c.num_kv_heads, hd, cs.data(), sn.data());
    RETURN_IF_ERROR(
        RunAttention(l, segments, starts, q.data(), k.data(), v.data(), att.data(), mass));
    MatMul(L.wo, att.data(), total, tmp.data(), pool, isa_);
    for (size_t i = 0; i < total * H; ++i) x[i] += tmp[i];
    RmsNorm(x.data(), L.ffn_norm.data(), xn.data(), total, H, c.rms_eps);
    const MatMulOutput gate_up[] = {{&L.gate, g.data()}, {&L.up, u.data()}};
    MatMulShared(gate_up, xn.data(), total, pool, isa_);
    for (size_t i = 0; i < total * c.ffn; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    MatMul(L.down, g.data(), total, tmp.data(), pool, isa_);
    for (size_t i = 0; i < total * H; ++i) x[i] += tmp[i];
  }
  // Logits only for the last token of each segment that wants them, batched.
  std::vector<size_t> rows, which;
  size_t end = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    end += segments[s].tokens.size();
    if (segments[s].logits != nullptr) {
      rows.push_back(end - 1);
      which.push_back(s);
    }
  }
  if (rows.empty()) return absl::OkStatus();
  std::vector<float> last(rows.size() * H), logits(rows.size() * c.vocab_size);
  for (size_t r = 0; r < rows.size(); ++r) {
    RmsNorm(x.data() + rows[r] * H, output_norm_.data(), last.data() + r * H, 1, H, c.rms_eps);
  }
  MatMul(output_, last.data(), rows.size(), logits.data(), pool, isa_);
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* src = logits.data() + r * c.vocab_size;
    segments[which[r]].logits->assign(src, src + c.vocab_size);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::engine
