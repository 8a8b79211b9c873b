#include "core/planning/models.h"

#include <cstdint>

#include "absl/strings/match.h"

namespace kvtier::planning {
namespace {

// config.json fields: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
// head_dim (hidden_size / num_attention_heads where absent), intermediate_size, vocab_size,
// tie_word_embeddings.
struct Entry {
  const char* name;
  const char* source;  // the Hugging Face repository whose config.json this is
  uint32_t layers, hidden, heads, kv_heads, head_dim;
  uint64_t intermediate, vocab;
  bool tied;
};

constexpr Entry kModels[] = {
    {"llama3-8b", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, false},
    {"llama3-70b", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, false},
    {"qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 128, 18944, 152064, false},
    {"qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 8, 128, 29568, 152064, false},
    {"deepseek-r1-distill-qwen-7b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 28, 3584, 28, 4, 128,
     18944, 152064, false},
    {"deepseek-r1-distill-qwen-32b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 64, 5120, 40, 8,
     128, 27648, 152064, false},
    {"mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", 32, 4096, 32, 8, 128, 14336, 32768, false},
};

constexpr double kBf16Bytes = 2;

}  // namespace

std::optional<ModelGeometry> FindBuiltinModel(absl::string_view name) {
  for (const Entry& e : kModels) {
    if (!absl::EqualsIgnoreCase(name, e.name)) continue;
    return ModelGeometry{
        .name = e.name,
        .num_layers = e.layers,
        .num_heads = e.heads,
        .num_kv_heads = e.kv_heads,
        .head_dim = e.head_dim,
        .weight_bytes =
            kBf16Bytes * DenseParameterCount(e.layers, e.hidden, e.heads, e.kv_heads, e.head_dim,
                                             e.intermediate, e.vocab, e.tied)};
  }
  return std::nullopt;
}

std::vector<std::string> BuiltinModelNames() {
  std::vector<std::string> names;
  for (const Entry& e : kModels) names.emplace_back(e.name);
  return names;
}

}  // namespace kvtier::planning
