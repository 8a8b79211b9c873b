#ifndef KVTIER_TESTS_UNIT_ENGINE_TINY_MODEL_H_
#define KVTIER_TESTS_UNIT_ENGINE_TINY_MODEL_H_

// A tiny synthetic Llama GGUF (mixed weight types, a byte-level vocabulary with the chat
// template's special tokens) written by tests that need a real Model without the download: the
// CPU engine's tests and the GPU engine test (tests/gpu/engine), which must run on a device
// without the 94 MiB model.

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/quant.h"
#include "engine/unicode.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gguf_writer.h"

namespace kvtier::engine::tiny {

constexpr uint32_t kLayers = 2, kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16;
constexpr uint32_t kFfn = 96, kVocab = 259, kContext = 40;
constexpr float kRopeBase = 10000.f, kEps = 1e-5f;

struct Tensor {
  std::vector<uint64_t> ne;
  GgmlType type;
  std::vector<uint8_t> bytes;
};

inline Tensor MakeTensor(std::vector<uint64_t> ne, GgmlType type, std::mt19937& rng, float scale,
                         float offset = 0) {
  std::normal_distribution<float> dist(0, scale);
  size_t n = 1;
  for (auto d : ne) n *= d;
  std::vector<float> x(n);
  for (float& v : x) v = offset + dist(rng);
  Tensor t{ne, type, {}};
  auto tr = GetGgmlTypeTraits(static_cast<uint32_t>(type));
  t.bytes.resize(n / tr->block_size * tr->type_size);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(t.bytes.data(), x.data(), n * 4);
      break;
    case GgmlType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = Fp32ToFp16(x[i]);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ4_0:
      QuantizeRowQ4_0(x.data(), t.bytes.data(), n);
      break;
    case GgmlType::kQ4_1:
      QuantizeRowQ4_1(x.data(), t.bytes.data(), n);
      break;
    case GgmlType::kQ8_0:
      QuantizeRowQ8_0(x.data(), t.bytes.data(), n);
      break;
    case GgmlType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &x[i], 4);
        const uint16_t b = static_cast<uint16_t>(bits >> 16);  // truncation: exact bf16 values
        std::memcpy(t.bytes.data() + 2 * i, &b, 2);
      }
      break;
    default:
      ADD_FAILURE() << "unhandled type";
  }
  return t;
}

// The model's shape: the defaults above, or another (the CUDA backend serves head_dim 64 or 128).
struct Shape {
  uint32_t layers = kLayers, hidden = kHidden, heads = kHeads, kv_heads = kKvHeads, ffn = kFfn;
  float qk_scale = 0.3f;  // the std of attn_q's and attn_k's weights
};

inline std::map<std::string, Tensor> MakeWeights(uint32_t seed, const Shape& shape = {}) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> w;
  const uint32_t kLayers = shape.layers, kHidden = shape.hidden, kFfn = shape.ffn;
  const uint64_t kv = uint64_t{shape.kv_heads} * (shape.hidden / shape.heads);
  w["token_embd.weight"] = MakeTensor({kHidden, kVocab}, GgmlType::kQ8_0, rng, 1.0f);
  w["output_norm.weight"] = MakeTensor({kHidden}, GgmlType::kF32, rng, 0.1f, 1.0f);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w[p + "attn_norm.weight"] = MakeTensor({kHidden}, GgmlType::kF32, rng, 0.1f, 1.0f);
    w[p + "ffn_norm.weight"] = MakeTensor({kHidden}, GgmlType::kF32, rng, 0.1f, 1.0f);
    w[p + "attn_q.weight"] = MakeTensor({kHidden, kHidden}, GgmlType::kQ4_1, rng, shape.qk_scale);
    w[p + "attn_k.weight"] = MakeTensor({kHidden, kv}, GgmlType::kQ4_1, rng, shape.qk_scale);
    w[p + "attn_v.weight"] = MakeTensor({kHidden, kv}, GgmlType::kF32, rng, 0.3f);
    w[p + "attn_output.weight"] = MakeTensor({kHidden, kHidden}, GgmlType::kQ8_0, rng, 0.1f);
    w[p + "ffn_gate.weight"] = MakeTensor({kHidden, kFfn}, GgmlType::kQ4_0, rng, 0.2f);
    w[p + "ffn_up.weight"] = MakeTensor({kHidden, kFfn}, GgmlType::kF16, rng, 0.2f);
    w[p + "ffn_down.weight"] = MakeTensor({kFfn, kHidden}, GgmlType::kQ4_1, rng, 0.1f);
  }
  return w;
}

inline std::string ByteToken(int b) {
  bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  int cp = b;
  if (!printable) {
    int k = 0;
    for (int i = 0; i < b; ++i) {
      if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174)) ++k;
    }
    cp = 256 + k;
  }
  std::string s;
  AppendUtf8(cp, s);
  return s;
}

inline void WriteModel(const std::string& path, const std::map<std::string, Tensor>& weights,
                       const std::string& arch = "llama", const std::string& pre = "smollm",
                       uint32_t context = kContext, bool control_tokens = false,
                       const Shape& shape = {}) {
  GgufWriter w;
  const int kKvs = 14 + control_tokens;
  w.Header(weights.size(), kKvs);
  w.KvStr("tokenizer.ggml.pre", pre);
  w.KvStr("general.architecture", arch);
  w.KvU32("llama.block_count", shape.layers);
  w.KvU32("llama.embedding_length", shape.hidden);
  w.KvU32("llama.attention.head_count", shape.heads);
  w.KvU32("llama.attention.head_count_kv", shape.kv_heads);
  w.KvU32("llama.feed_forward_length", shape.ffn);
  w.KvU32("llama.context_length", context);
  w.Str("llama.rope.freq_base");
  w.Put<uint32_t>(6);
  w.Put<float>(kRopeBase);
  w.Str("llama.attention.layer_norm_rms_epsilon");
  w.Put<uint32_t>(6);
  w.Put<float>(kEps);
  w.KvStr("tokenizer.ggml.model", "gpt2");
  w.KvU32("tokenizer.ggml.eos_token_id", 256);
  w.Str("tokenizer.ggml.tokens");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(8);
  w.Put<uint64_t>(kVocab);
  for (int b = 0; b < 256; ++b) w.Str(ByteToken(b));
  w.Str("<|im_end|>");
  w.Str("ab");
  w.Str("<|im_start|>");
  if (control_tokens) {  // <|im_end|> and <|im_start|> are control tokens (type 3), as in SmolLM2
    w.Str("tokenizer.ggml.token_type");
    w.Put<uint32_t>(9);
    w.Put<uint32_t>(5);
    w.Put<uint64_t>(kVocab);
    for (uint32_t id = 0; id < kVocab; ++id) w.Put<int32_t>(id == 256 || id == 258 ? 3 : 1);
  }
  w.Str("tokenizer.ggml.merges");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(8);
  w.Put<uint64_t>(1);
  w.Str("a b");
  uint64_t offset = 0;
  for (const auto& [name, t] : weights) {
    w.TensorInfo(name, t.ne, static_cast<uint32_t>(t.type), offset);
    offset += (t.bytes.size() + 31) / 32 * 32;
  }
  w.Align(32);
  for (const auto& [name, t] : weights) {
    w.Raw(t.bytes.data(), t.bytes.size());
    w.Align(32);
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(w.bytes().data()), w.bytes().size());
}

// The tiny model of `seed` at `path` with a context of `context` tokens (room for chat prompts
// and a hundred decode steps), the chat template's control tokens, and head_dim 64 (2 layers,
// hidden 128, 2 query heads, 1 KV head: a shape the CUDA backend serves): what a test loads in
// place of the real model.
// Its q/k weights are small enough that attention scores have the spread of a trained model's
// (std ~1.3): at 0.3 (std ~12) the softmax is near one-hot, f16 rounding flips which position
// wins, and the GPU engine's logits differed from the CPU engine's by 11% of their range.
inline constexpr Shape kChatShape{
    .layers = 2, .hidden = 128, .heads = 2, .kv_heads = 1, .ffn = 128, .qk_scale = 0.1f};
inline void WriteTinyChatModel(const std::string& path, uint32_t seed, uint32_t context = 512) {
  WriteModel(path, MakeWeights(seed, kChatShape), "llama", "smollm", context, true, kChatShape);
}

}  // namespace kvtier::engine::tiny

#endif  // KVTIER_TESTS_UNIT_ENGINE_TINY_MODEL_H_
