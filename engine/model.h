#ifndef KVTIER_ENGINE_MODEL_H_
#define KVTIER_ENGINE_MODEL_H_

// Reference Llama-family forward pass over a GGUF file (SmolLM2-135M-Instruct Q4_1 is the
// project's model). Weights stay quantized in the read-only mapping of the file; activations
// are f32. Attention goes through worker::AttentionCache: the model computes Q/K/V, applies
// adjacent-pair RoPE (GGUF "normal" layout), appends post-RoPE K/V and asks the cache to attend.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/matmul.h"
#include "engine/quant.h"
#include "engine/thread_pool.h"
#include "engine/tokenizer.h"
#include "worker/attention_cache.h"

namespace kvtier::engine {

struct ModelOptions {
  int threads = 2;  // matmul threads (the calling thread included)
  // Kernel implementation; unset = best available (see DetectKernelIsa).
  std::optional<KernelIsa> isa;
};

// Hyper-parameters read from the GGUF metadata (llama.*).
struct ModelConfig {
  std::string architecture;  // "llama"
  std::string name;          // general.name
  uint32_t num_layers = 0;
  uint32_t hidden = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t ffn = 0;
  uint32_t vocab_size = 0;
  uint32_t context_length = 0;
  float rope_base = 10000.f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
};

// One decode step of one sequence: feed `token`, get the next-token logits.
struct DecodeRequest {
  int32_t token = 0;
  worker::AttentionCache* cache = nullptr;  // the sequence's cache; not owned
  std::vector<float>* logits = nullptr;     // resized to vocab_size; may be null
  // Optional: per cached position, (1/layers) Σ_layers (1/heads) Σ_heads softmax weight of this
  // step (the cumulative-attention score increment, DESIGN §2); resized to the cache length.
  std::vector<float>* position_mass = nullptr;
};

// Checks one forward pass of `tokens` after `cached` positions before any cache is touched:
// ids in the vocabulary, cached + new within the context length (INVALID_ARGUMENT). Shared by
// every device's forward pass.
absl::Status CheckPass(const ModelConfig& config, uint32_t cached, std::span<const int32_t> tokens);
// A pass's caches advance layer by layer: FAILED_PRECONDITION unless `cache` holds `start`
// positions in `layer` (what it held in layer 0 when the pass began).
absl::Status CheckLayerLength(const worker::AttentionCache& cache, uint32_t layer, uint32_t start,
                              size_t segment);
// A decode batch: every request has a cache and no two share one (INVALID_ARGUMENT).
absl::Status CheckDecodeBatch(std::span<const DecodeRequest> batch);

// Immutable weights plus a thread pool. Thread-compatible: one forward call at a time.
class Model {
 public:
  // Opens and validates the model: architecture "llama", every tensor present with the shape
  // the metadata implies and a supported type. NOT_FOUND (with how to get the model) when the
  // file is missing; INVALID_ARGUMENT for wrong architecture or malformed files.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const ModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  ThreadPool& pool() { return *pool_; }
  KernelIsa isa() const { return isa_; }
  // The attention geometry a cache for this model must have (scale 1/sqrt(head_dim)).
  worker::AttentionShape attention_shape() const;
  // RoPE inverse frequencies base^(-2i/head_dim), i < head_dim / 2, in double.
  std::span<const double> rope_inv_freq() const { return inv_freq_; }

  // Runs all `tokens` of one sequence in one batched pass (matrix-matrix), appending their
  // K/V to `cache` after what it already holds; writes the last token's logits when
  // `last_logits` is not null. INVALID_ARGUMENT for empty input, out-of-vocabulary ids, or
  // when cache length + tokens exceeds the context length.
  absl::Status Prefill(std::span<const int32_t> tokens, worker::AttentionCache& cache,
                       std::vector<float>* last_logits,
                       std::vector<float>* position_mass = nullptr);

  // One token for each of several sequences, batched through the weights once. Each request
  // must have its own cache.
  //
  // Both calls validate their input before touching any cache; if a cache itself fails later
  // (e.g. RESOURCE_EXHAUSTED from Append), caches may hold part of the pass and the sequence
  // should be discarded.
  absl::Status Decode(std::span<const DecodeRequest> batch);

 private:
  struct Layer {
    std::span<const float> attn_norm, ffn_norm;
    WeightMatrix wq, wk, wv, wo, gate, up, down;
  };
  struct Segment {
    std::span<const int32_t> tokens;
    worker::AttentionCache* cache;
    std::vector<float>* logits;
    std::vector<float>* position_mass;
  };

  Model() = default;
  absl::Status BindTensors();
  absl::Status Forward(std::span<const Segment> segments);
  absl::Status RunAttention(uint32_t layer, std::span<const Segment> segments,
                            const std::vector<uint32_t>& starts, const float* q, const float* k,
                            const float* v, float* out, std::vector<float>& mass_scratch);

  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  KernelIsa isa_ = KernelIsa::kScalar;
  ModelConfig config_;
  WeightMatrix token_embd_, output_;
  std::span<const float> output_norm_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;  // RoPE: base^(-2i/head_dim)
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_MODEL_H_
