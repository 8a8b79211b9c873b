#include "client/kvtierctl/model_source.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/planning/models.h"
#include "core/status/status_macros.h"

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

// GGUF metadata, read without the tensors: engine::GgufFile validates every tensor and knows
// only the types the engine runs, so it refuses K-quant files (most published GGUFs), and sizing
// needs a handful of keys. Integers and strings are kept; arrays are skipped.
class GgufMetadata {
 public:
  static absl::StatusOr<GgufMetadata> Read(const std::string& path) {
    GgufMetadata m;
    m.in_.open(path, std::ios::binary);
    m.path_ = path;
    uint32_t magic = 0, version = 0;
    uint64_t tensors = 0, count = 0;
    if (!m.Get(&magic) || !m.Get(&version) || !m.Get(&tensors) || !m.Get(&count)) {
      return m.Error("truncated header");
    }
    if (magic != 0x46554747 || version < 2 || version > 3) return m.Error("not GGUF v2/v3");
    for (uint64_t i = 0; i < count; ++i) {
      std::string key;
      uint32_t type = 0;
      if (!m.GetString(&key) || !m.Get(&type) || !m.Value(key, type, 0)) {
        return m.Error(absl::StrCat("bad metadata entry ", i));
      }
    }
    return m;
  }
  absl::StatusOr<uint64_t> Uint(const std::string& key) const {
    auto it = ints_.find(key);
    if (it == ints_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": missing key '", key, "'"));
    }
    return it->second;
  }
  bool Has(const std::string& key) const { return ints_.count(key) || strings_.count(key); }
  std::string String(const std::string& key) const {
    auto it = strings_.find(key);
    return it == strings_.end() ? "" : it->second;
  }

 private:
  template <typename T>
  bool Get(T* v) {
    return static_cast<bool>(in_.read(reinterpret_cast<char*>(v), sizeof(T)));
  }
  bool GetString(std::string* s) {
    uint64_t n = 0;
    if (!Get(&n) || n > (1u << 20)) return false;
    s->resize(n);
    return n == 0 || static_cast<bool>(in_.read(s->data(), static_cast<std::streamsize>(n)));
  }
  // One value of GGUF type `type` (0..12); integers and strings under `key` when depth is 0.
  bool Value(const std::string& key, uint32_t type, int depth) {
    static constexpr int kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type > 12 || depth > 2) return false;
    if (type == 8) {
      std::string s;
      if (!GetString(&s)) return false;
      if (depth == 0) strings_[key] = std::move(s);
      return true;
    }
    if (type == 9) {
      uint32_t elem = 0;
      uint64_t n = 0;
      if (!Get(&elem) || !Get(&n) || n > (uint64_t{1} << 32)) return false;
      if (elem != 8 && elem != 9 && elem <= 12) {
        return static_cast<bool>(
            in_.seekg(static_cast<std::streamoff>(n * kSize[elem]), std::ios::cur));
      }
      for (uint64_t i = 0; i < n; ++i) {
        if (!Value(key, elem, depth + 1)) return false;
      }
      return true;
    }
    uint64_t raw = 0;
    if (!in_.read(reinterpret_cast<char*>(&raw), kSize[type])) return false;
    const bool is_int = type <= 5 || type == 10 || type == 11;
    if (depth == 0 && is_int) ints_[key] = raw;  // little-endian; negatives read as huge
    return true;
  }
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": GGUF metadata: ", what));
  }

  std::ifstream in_;
  std::string path_;
  std::map<std::string, uint64_t> ints_;
  std::map<std::string, std::string> strings_;
};

// A GGUF file's geometry (llama.cpp's keys, prefixed by general.architecture). Weights: the
// file's size (its tensors in their stored, possibly quantized, form).
absl::StatusOr<ModelGeometry> FromGguf(const std::string& path) {
  ASSIGN_OR_RETURN(GgufMetadata meta, GgufMetadata::Read(path));
  const std::string arch = meta.String("general.architecture");
  if (arch.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing key 'general.architecture'"));
  }
  auto key = [&](const char* k) { return absl::StrCat(arch, ".", k); };
  ASSIGN_OR_RETURN(uint64_t layers, meta.Uint(key("block_count")));
  ASSIGN_OR_RETURN(uint64_t heads, meta.Uint(key("attention.head_count")));
  ASSIGN_OR_RETURN(uint64_t hidden, meta.Uint(key("embedding_length")));
  uint64_t kv = heads, head_dim = heads == 0 ? 0 : hidden / heads;
  if (meta.Has(key("attention.head_count_kv"))) {
    ASSIGN_OR_RETURN(kv, meta.Uint(key("attention.head_count_kv")));
  }
  if (meta.Has(key("attention.key_length"))) {
    ASSIGN_OR_RETURN(head_dim, meta.Uint(key("attention.key_length")));
  }
  for (auto [k, v] : {std::pair{"block_count", layers}, std::pair{"attention.head_count", heads},
                      std::pair{"attention.head_count_kv", kv}, std::pair{"head_dim", head_dim}}) {
    if (v == 0 || v > 0xffffffffu) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", arch, ".", k, " must be in [1, 4294967295], got ", v));
    }
  }
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  const std::string name = meta.String("general.name");
  return ModelGeometry{.name = name.empty() ? path : name,
                       .num_layers = static_cast<uint32_t>(layers),
                       .num_heads = static_cast<uint32_t>(heads),
                       .num_kv_heads = static_cast<uint32_t>(kv),
                       .head_dim = static_cast<uint32_t>(head_dim),
                       .weight_bytes = static_cast<double>(size)};
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
