#ifndef KVTIER_TESTS_UNIT_ENGINE_GGUF_WRITER_H_
#define KVTIER_TESTS_UNIT_ENGINE_GGUF_WRITER_H_

// Test helper: writes GGUF bytes the way the spec lays them out.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::engine {

class GgufWriter {
 public:
  template <typename T>
  void Put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    Put<uint32_t>(0x46554747);
    Put<uint32_t>(version);
    Put<uint64_t>(n_tensors);
    Put<uint64_t>(n_kv);
  }
  void KvU32(const std::string& k, uint32_t v) {
    Str(k);
    Put<uint32_t>(4);
    Put<uint32_t>(v);
  }
  void KvStr(const std::string& k, const std::string& v) {
    Str(k);
    Put<uint32_t>(8);
    Str(v);
  }
  void TensorInfo(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
    Str(name);
    Put<uint32_t>(ne.size());
    for (uint64_t d : ne) Put<uint64_t>(d);
    Put<uint32_t>(type);
    Put<uint64_t>(offset);
  }
  void Align(size_t a) {
    while (bytes_.size() % a) bytes_.push_back(0);
  }
  void Fill(size_t n, uint8_t v) { bytes_.insert(bytes_.end(), n, v); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_TESTS_UNIT_ENGINE_GGUF_WRITER_H_
