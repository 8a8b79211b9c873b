// libFuzzer target for the GGUF reader (engine/gguf): any bytes are either a file whose
// every tensor lies inside the buffer and whose metadata reads back by key, or an error naming
// the file; never a crash, an out-of-bounds read (ASan) or undefined behaviour (UBSan).
//
// Built with -DKVTIER_FUZZ=ON (clang), and in the normal build as gguf_fuzz_replay.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "engine/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvtier::engine::GgufFile;
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::FromBuffer(data, size, "fuzz.gguf");
  if (!f.ok()) {
    if (f.status().message().find("fuzz.gguf") == std::string_view::npos) std::abort();
    return 0;
  }
  const GgufFile& file = **f;
  if (file.version() != 3 || file.alignment() == 0) std::abort();
  for (const std::string& key : file.metadata_keys()) {
    if (file.Find(key) == nullptr) std::abort();
    (void)file.GetUint(key);
    (void)file.GetFloat(key);
    (void)file.GetString(key);
  }
  volatile uint8_t sink = 0;
  for (const auto& t : file.tensors()) {
    if (file.FindTensor(t.name) == nullptr) std::abort();
    if (t.num_bytes == 0) continue;
    if (t.data < data || t.data + t.num_bytes > data + size || t.data + t.num_bytes < t.data) {
      std::abort();
    }
    sink = sink + t.data[0] + t.data[t.num_bytes - 1];  // ASan checks both ends
  }
  return 0;
}
