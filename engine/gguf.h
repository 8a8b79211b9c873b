#ifndef KVTIER_ENGINE_GGUF_H_
#define KVTIER_ENGINE_GGUF_H_

// Read-only GGUF v3 reader. The file is memory-mapped; tensor data is never copied, so weights
// stay in their on-disk (quantized) form and are paged in by the kernel on first use.
// Format facts: docs/gguf.md in ggml-org/ggml (see shared/REFERENCE.md).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::engine {

// GGUF metadata value types (the u32 tag in the file).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// ggml tensor element types this project knows the block layout of.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kQ6_K = 14,
  kBF16 = 30,
};

// Block geometry of a tensor type: `block_size` elements are stored in `type_size` bytes.
struct GgmlTypeTraits {
  const char* name;
  uint32_t block_size;
  uint32_t type_size;
};

// Traits of `type`, or NOT_FOUND / UNIMPLEMENTED for ids this reader does not support.
absl::StatusOr<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type);

struct GgufValue;
using GgufArray = std::vector<GgufValue>;

// One metadata value. Integers keep their declared type (`type`), stored widened.
struct GgufValue {
  GgufType type = GgufType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;

  // Checked accessors: INVALID_ARGUMENT naming the key's actual type on mismatch.
  absl::StatusOr<uint64_t> AsUint() const;  // any unsigned, or non-negative signed integer
  absl::StatusOr<double> AsFloat() const;   // f32 / f64
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string> AsString() const;
  absl::StatusOr<const GgufArray*> AsArray() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] = contiguous (input) dimension
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the tensor-data section
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
};

// An open, fully validated GGUF file. Immutable after Open: thread-safe for concurrent reads.
class GgufFile {
 public:
  // Maps and validates `path`: magic, version 3, every metadata value, tensor infos (dims,
  // types, alignment, data inside the file, no overlap). Errors name the file, the byte offset
  // and what was expected.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Same, over caller-owned bytes that must outlive the returned object (used by tests).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(const uint8_t* data, size_t size,
                                                              std::string name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  // Metadata lookup; nullptr when absent.
  const GgufValue* Find(std::string_view key) const;
  // Typed required lookups: NOT_FOUND when absent, INVALID_ARGUMENT when of another type.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  const std::vector<std::string>& metadata_keys() const { return keys_; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool owns_mapping_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_GGUF_H_
