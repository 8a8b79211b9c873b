#include "engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"

namespace kvtier::engine {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;

// Bounds-checked little-endian cursor over the file bytes; every error names file and offset.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Error(std::string_view what) const { return ErrorAt(pos_, what); }
  absl::Status ErrorAt(size_t at, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("GGUF file '%s', offset %d: %s", name_, at, what));
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    if (remaining() < sizeof(T)) {
      return Error(absl::StrFormat("truncated: expected %d-byte %s, %d bytes left", sizeof(T), what,
                                   remaining()));
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(std::string_view what) {
    ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(absl::StrCat(
                                       absl::string_view(what.data(), what.size()), " length")));
    if (len > remaining()) {
      return Error(absl::StrFormat("truncated: %s of length %d, only %d bytes left", what, len,
                                   remaining()));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  const std::string& name_;
  size_t pos_ = 0;
};

const char* TypeName(GgufType t) {
  static const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

absl::StatusOr<GgufValue> ReadValue(Cursor& c, GgufType type, int depth);

absl::StatusOr<GgufValue> ReadArray(Cursor& c, int depth) {
  if (depth >= kMaxArrayDepth) return c.Error("arrays nested deeper than 8 levels");
  size_t at = c.offset();
  ASSIGN_OR_RETURN(uint32_t elem_type, c.Read<uint32_t>("array element type"));
  if (elem_type > static_cast<uint32_t>(GgufType::kF64)) {
    return c.ErrorAt(at,
                     absl::StrFormat("unknown array element type %d (expected 0..12)", elem_type));
  }
  ASSIGN_OR_RETURN(uint64_t count, c.Read<uint64_t>("array count"));
  // Every element takes at least one byte: reject impossible counts before allocating.
  if (count > c.remaining()) {
    return c.Error(absl::StrFormat("truncated: array of %d elements, only %d bytes left", count,
                                   c.remaining()));
  }
  GgufArray items;
  items.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(GgufValue v, ReadValue(c, static_cast<GgufType>(elem_type), depth + 1));
    items.push_back(std::move(v));
  }
  GgufValue out;
  out.type = GgufType::kArray;
  out.value = std::move(items);
  return out;
}

absl::StatusOr<GgufValue> ReadValue(Cursor& c, GgufType type, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::kU8: {
      ASSIGN_OR_RETURN(uint8_t x, c.Read<uint8_t>("u8"));
      v.value = uint64_t{x};
      break;
    }
    case GgufType::kI8: {
      ASSIGN_OR_RETURN(int8_t x, c.Read<int8_t>("i8"));
      v.value = int64_t{x};
      break;
    }
    case GgufType::kU16: {
      ASSIGN_OR_RETURN(uint16_t x, c.Read<uint16_t>("u16"));
      v.value = uint64_t{x};
      break;
    }
    case GgufType::kI16: {
      ASSIGN_OR_RETURN(int16_t x, c.Read<int16_t>("i16"));
      v.value = int64_t{x};
      break;
    }
    case GgufType::kU32: {
      ASSIGN_OR_RETURN(uint32_t x, c.Read<uint32_t>("u32"));
      v.value = uint64_t{x};
      break;
    }
    case GgufType::kI32: {
      ASSIGN_OR_RETURN(int32_t x, c.Read<int32_t>("i32"));
      v.value = int64_t{x};
      break;
    }
    case GgufType::kU64: {
      ASSIGN_OR_RETURN(uint64_t x, c.Read<uint64_t>("u64"));
      v.value = x;
      break;
    }
    case GgufType::kI64: {
      ASSIGN_OR_RETURN(int64_t x, c.Read<int64_t>("i64"));
      v.value = x;
      break;
    }
    case GgufType::kF32: {
      ASSIGN_OR_RETURN(float x, c.Read<float>("f32"));
      v.value = double{x};
      break;
    }
    case GgufType::kF64: {
      ASSIGN_OR_RETURN(double x, c.Read<double>("f64"));
      v.value = x;
      break;
    }
    case GgufType::kBool: {
      size_t at = c.offset();
      ASSIGN_OR_RETURN(uint8_t x, c.Read<uint8_t>("bool"));
      if (x > 1) return c.ErrorAt(at, absl::StrFormat("bool value %d (expected 0 or 1)", x));
      v.value = x == 1;
      break;
    }
    case GgufType::kString: {
      ASSIGN_OR_RETURN(std::string s, c.ReadString("string value"));
      v.value = std::move(s);
      break;
    }
    case GgufType::kArray:
      return ReadArray(c, depth);
    default:
      return c.Error(absl::StrFormat("unknown value type %d", static_cast<uint32_t>(type)));
  }
  return v;
}

absl::Status TypeMismatch(const GgufValue& v, std::string_view wanted) {
  return absl::InvalidArgumentError(
      absl::StrFormat("GGUF value of type %s, expected %s", TypeName(v.type), wanted));
}

}  // namespace

absl::StatusOr<GgmlTypeTraits> GetGgmlTypeTraits(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return GgmlTypeTraits{"f32", 1, 4};
    case GgmlType::kF16:
      return GgmlTypeTraits{"f16", 1, 2};
    case GgmlType::kBF16:
      return GgmlTypeTraits{"bf16", 1, 2};
    case GgmlType::kQ4_0:
      return GgmlTypeTraits{"q4_0", 32, 18};
    case GgmlType::kQ4_1:
      return GgmlTypeTraits{"q4_1", 32, 20};
    case GgmlType::kQ8_0:
      return GgmlTypeTraits{"q8_0", 32, 34};
    case GgmlType::kQ6_K:
      return GgmlTypeTraits{"q6_k", 256, 210};
  }
  return absl::UnimplementedError(absl::StrFormat(
      "ggml tensor type %d is not supported (supported: f32 0, f16 1, q4_0 2, q4_1 3, q8_0 8, "
      "q6_k 14, bf16 30)",
      type));
}

absl::StatusOr<uint64_t> GgufValue::AsUint() const {
  if (const auto* u = std::get_if<uint64_t>(&value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&value)) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    return absl::InvalidArgumentError(absl::StrCat("negative integer ", *i));
  }
  return TypeMismatch(*this, "integer");
}
absl::StatusOr<double> GgufValue::AsFloat() const {
  if (const auto* d = std::get_if<double>(&value)) return *d;
  return TypeMismatch(*this, "f32/f64");
}
absl::StatusOr<bool> GgufValue::AsBool() const {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  return TypeMismatch(*this, "bool");
}
absl::StatusOr<std::string> GgufValue::AsString() const {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  return TypeMismatch(*this, "string");
}
absl::StatusOr<const GgufArray*> GgufValue::AsArray() const {
  if (const auto* a = std::get_if<GgufArray>(&value)) return a;
  return TypeMismatch(*this, "array");
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open GGUF file '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("GGUF path '", path, "' is not a regular file"));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap of '", path, "' failed: ", std::strerror(err)));
    }
  }
  ::close(fd);
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = path;
  file->base_ = static_cast<const uint8_t*>(map);
  file->size_ = size;
  file->owns_mapping_ = size > 0;
  RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(const uint8_t* data, size_t size,
                                                               std::string name) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = std::move(name);
  file->base_ = data;
  file->size_ = size;
  RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (owns_mapping_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_, path_);
  ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != kGgufMagic) {
    return c.ErrorAt(
        0, absl::StrFormat("bad magic 0x%08x (expected 0x%08x \"GGUF\")", magic, kGgufMagic));
  }
  ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ != 3) {
    return c.ErrorAt(4, absl::StrFormat("unsupported GGUF version %d (expected 3)", version_));
  }
  ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // A key/value takes at least 12 bytes and a tensor info at least 24: bound before reserving.
  if (n_kv > c.remaining() / 12 || n_tensors > c.remaining() / 24) {
    return c.ErrorAt(8, absl::StrFormat("implausible counts: %d tensors, %d metadata keys for "
                                        "a %d-byte file",
                                        n_tensors, n_kv, size_));
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    size_t at = c.offset();
    ASSIGN_OR_RETURN(std::string key, c.ReadString("metadata key"));
    size_t type_at = c.offset();
    ASSIGN_OR_RETURN(uint32_t type, c.Read<uint32_t>("metadata value type"));
    if (type > static_cast<uint32_t>(GgufType::kF64)) {
      return c.ErrorAt(type_at, absl::StrFormat("metadata key '%s': unknown value type %d "
                                                "(expected 0..12)",
                                                key, type));
    }
    ASSIGN_OR_RETURN(GgufValue value, ReadValue(c, static_cast<GgufType>(type), 0));
    if (!metadata_.emplace(key, std::move(value)).second) {
      return c.ErrorAt(at, absl::StrFormat("duplicate metadata key '%s'", key));
    }
    keys_.push_back(key);
  }
  if (const GgufValue* a = Find("general.alignment")) {
    auto v = a->AsUint();
    if (!v.ok() || *v == 0 || (*v & (*v - 1)) != 0 || *v > 65536) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF file '%s': general.alignment must be a power of two integer, got %s", path_,
          v.ok() ? absl::StrCat(*v) : v.status().message()));
    }
    alignment_ = *v;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    ASSIGN_OR_RETURN(t.name, c.ReadString("tensor name"));
    size_t dims_at = c.offset();
    ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>("tensor n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return c.ErrorAt(dims_at,
                       absl::StrFormat("tensor '%s': n_dims %d (expected 1..4)", t.name, n_dims));
    }
    t.num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      size_t ne_at = c.offset();
      ASSIGN_OR_RETURN(uint64_t ne, c.Read<uint64_t>("tensor dimension"));
      if (ne == 0 || ne > (uint64_t{1} << 40) || t.num_elements > (uint64_t{1} << 40) / ne) {
        return c.ErrorAt(
            ne_at, absl::StrFormat("tensor '%s': dimension %d = %d out of range", t.name, d, ne));
      }
      t.ne.push_back(ne);
      t.num_elements *= ne;
    }
    size_t type_at = c.offset();
    ASSIGN_OR_RETURN(uint32_t type, c.Read<uint32_t>("tensor type"));
    auto traits = GetGgmlTypeTraits(type);
    if (!traits.ok()) {
      return c.ErrorAt(type_at, absl::StrCat("tensor '", t.name, "': ", traits.status().message()));
    }
    if (t.ne[0] % traits->block_size != 0) {
      return c.ErrorAt(dims_at, absl::StrFormat("tensor '%s': ne[0] = %d not a multiple of the "
                                                "%s block size %d",
                                                t.name, t.ne[0], traits->name, traits->block_size));
    }
    t.type = static_cast<GgmlType>(type);
    t.num_bytes = t.num_elements / traits->block_size * traits->type_size;
    size_t off_at = c.offset();
    ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>("tensor data offset"));
    if (t.offset % alignment_ != 0) {
      return c.ErrorAt(off_at, absl::StrFormat("tensor '%s': data offset %d not a multiple of "
                                               "alignment %d",
                                               t.name, t.offset, alignment_));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return c.ErrorAt(off_at, absl::StrFormat("duplicate tensor name '%s'", t.name));
    }
    tensors_.push_back(std::move(t));
  }
  uint64_t data_start = (c.offset() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > size_) {
    return c.Error(
        absl::StrFormat("truncated: tensor data section expected at offset %d, file "
                        "has %d bytes",
                        data_start, size_));
  }
  // Data ranges must lie inside the file and not overlap.
  std::vector<std::pair<uint64_t, size_t>> ranges;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    uint64_t avail = size_ - data_start;
    if (t.offset > avail || t.num_bytes > avail - t.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GGUF file '%s', offset %d: truncated: tensor '%s' needs bytes [%d, %d), file has %d",
          path_, data_start + t.offset, t.name, data_start + t.offset,
          data_start + t.offset + t.num_bytes, size_));
    }
    t.data = base_ + data_start + t.offset;
    ranges.emplace_back(t.offset, i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const GgufTensorInfo& prev = tensors_[ranges[i - 1].second];
    if (prev.offset + prev.num_bytes > ranges[i].first) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GGUF file '%s': tensor '%s' overlaps tensor '%s'", path_, prev.name,
                          tensors_[ranges[i].second].name));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(absl::string_view(key.data(), key.size()));
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
template <typename T, typename F>
absl::StatusOr<T> GetTyped(const GgufFile& f, std::string_view key, F getter) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("GGUF file '%s': metadata key '%s' is missing", f.path(), key));
  }
  auto r = getter(*v);
  if (!r.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("GGUF file '%s': metadata key '%s': %s",
                                                      f.path(), key, r.status().message()));
  }
  return r;
}
}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  return GetTyped<uint64_t>(*this, key, [](const GgufValue& v) { return v.AsUint(); });
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  return GetTyped<double>(*this, key, [](const GgufValue& v) { return v.AsFloat(); });
}
absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  return GetTyped<std::string>(*this, key, [](const GgufValue& v) { return v.AsString(); });
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kvtier::engine
