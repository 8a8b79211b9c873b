#include "client/kvtierctl/model_source.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/planning/models.h"
#include "core/status/status_macros.h"
#include "engine/gguf.h"

namespace kvtier::ctl {
namespace {

using planning::ModelGeometry;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read model file ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A key of a config.json as a positive integer below 2^32; `fallback` when absent and given.
absl::StatusOr<uint64_t> JsonUint(const nlohmann::json& j, const char* key, const std::string& name,
                                  std::optional<uint64_t> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(name, ": missing key '", key, "'"));
  }
  if (!j[key].is_number_unsigned() || j[key].get<uint64_t>() == 0 ||
      j[key].get<uint64_t>() > 0xffffffffu) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": key '", key, "' must be an integer in ",
                                                   "[1, 4294967295], got ", j[key].dump()));
  }
  return j[key].get<uint64_t>();
}

// Metadata of a GGUF file (llama.cpp's keys, prefixed by general.architecture). Weights: the
// file's size (its tensors in their stored, possibly quantized, form).
absl::StatusOr<ModelGeometry> FromGguf(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, engine::GgufFile::Open(path));
  ASSIGN_OR_RETURN(const std::string arch, file->GetString("general.architecture"));
  auto get = [&](const char* key) { return file->GetUint(absl::StrCat(arch, ".", key)); };
  auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  ModelGeometry m;
  m.name = file->Find("general.name") ? file->GetString("general.name").value_or(path) : path;
  auto layers = get("block_count");
  auto heads = get("attention.head_count");
  auto hidden = get("embedding_length");
  if (!layers.ok()) return named(layers.status());
  if (!heads.ok()) return named(heads.status());
  if (!hidden.ok()) return named(hidden.status());
  auto kv = file->Find(absl::StrCat(arch, ".attention.head_count_kv"))
                ? get("attention.head_count_kv")
                : heads;
  if (!kv.ok()) return named(kv.status());
  if (*heads == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": head_count is 0"));
  auto head_dim = file->Find(absl::StrCat(arch, ".attention.key_length"))
                      ? get("attention.key_length")
                      : absl::StatusOr<uint64_t>(*hidden / *heads);
  if (!head_dim.ok()) return named(head_dim.status());
  for (auto [key, v] : {std::pair{"block_count", *layers}, std::pair{"head_count", *heads},
                        std::pair{"head_count_kv", *kv}, std::pair{"head_dim", *head_dim}}) {
    if (v > 0xffffffffu) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " = ", v, " out of range"));
    }
  }
  m.num_layers = static_cast<uint32_t>(*layers);
  m.num_heads = static_cast<uint32_t>(*heads);
  m.num_kv_heads = static_cast<uint32_t>(*kv);
  m.head_dim = static_cast<uint32_t>(*head_dim);
  m.weight_bytes = static_cast<double>(file->file_size());
  return m;
}

bool IsGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

absl::StatusOr<ModelGeometry> ParseHfConfig(const std::string& text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  if (j.contains("kv_lora_rank")) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ": multi-head latent attention (kv_lora_rank) caches a latent, not K/V heads; "
                     "the planner sizes MHA/GQA models only"));
  }
  ASSIGN_OR_RETURN(uint64_t layers, JsonUint(j, "num_hidden_layers", name, std::nullopt));
  ASSIGN_OR_RETURN(uint64_t hidden, JsonUint(j, "hidden_size", name, std::nullopt));
  ASSIGN_OR_RETURN(uint64_t heads, JsonUint(j, "num_attention_heads", name, std::nullopt));
  ASSIGN_OR_RETURN(uint64_t kv, JsonUint(j, "num_key_value_heads", name, heads));
  ASSIGN_OR_RETURN(uint64_t head_dim, JsonUint(j, "head_dim", name, hidden / heads));
  ASSIGN_OR_RETURN(uint64_t ffn, JsonUint(j, "intermediate_size", name, std::nullopt));
  ASSIGN_OR_RETURN(uint64_t vocab, JsonUint(j, "vocab_size", name, std::nullopt));
  const bool tied = j.value("tie_word_embeddings", false);
  const std::string dtype = j.contains("torch_dtype") && j["torch_dtype"].is_string()
                                ? j["torch_dtype"].get<std::string>()
                                : "bfloat16";
  const double dtype_bytes = dtype == "float32" ? 4 : 2;
  ModelGeometry m{.name = name,
                  .num_layers = static_cast<uint32_t>(layers),
                  .num_heads = static_cast<uint32_t>(heads),
                  .num_kv_heads = static_cast<uint32_t>(kv),
                  .head_dim = static_cast<uint32_t>(head_dim)};
  m.weight_bytes =
      dtype_bytes * planning::DenseParameterCount(m.num_layers, hidden, m.num_heads, m.num_kv_heads,
                                                  m.head_dim, ffn, vocab, tied);
  return m;
}

absl::StatusOr<ModelGeometry> LoadModel(const std::string& spec) {
  std::error_code ec;
  std::string path = spec;
  if (std::filesystem::is_directory(path, ec)) path = (std::filesystem::path(path) / "config.json");
  if (std::filesystem::exists(path, ec)) {
    if (IsGguf(path)) return FromGguf(path);
    ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
    return ParseHfConfig(text, path);
  }
  if (auto m = planning::FindBuiltinModel(spec)) return *m;
  if (absl::StrContains(spec, '/') || absl::EndsWith(spec, ".gguf") ||
      absl::EndsWith(spec, ".json")) {
    return absl::NotFoundError(absl::StrCat("cannot read model file ", path, ": no such file"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", spec, "': not a file, and not one of the built-in models (",
                   absl::StrJoin(planning::BuiltinModelNames(), ", "), ")"));
}

absl::StatusOr<HostMemory> ParseMeminfo(const std::string& text) {
  HostMemory mem;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t kib = 0;
    if (f.size() < 2 || !absl::SimpleAtoi(f[1], &kib)) continue;
    if (f[0] == "MemTotal:") mem.total_bytes = kib * 1024;
    if (f[0] == "MemAvailable:") mem.available_bytes = kib * 1024;
  }
  if (mem.total_bytes == 0 || mem.available_bytes == 0) {
    return absl::InvalidArgumentError("/proc/meminfo: no MemTotal or MemAvailable line");
  }
  return mem;
}

}  // namespace kvtier::ctl
