// The GGUF fuzz target without libFuzzer: a small valid file (every value type, nested arrays,
// two tensors) mutated many ways (bytes flipped, counts and lengths inflated, cut short,
// tensor offsets and dimensions changed). Counts how many inputs parsed, so the test fails if
// the mutations never produce a valid file either.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "fuzz/corpus_files.h"
#include "tests/unit/engine/gguf_writer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using kvtier::engine::GgufWriter;

std::vector<uint8_t> ValidFile() {
  GgufWriter w;
  w.Header(/*n_tensors=*/2, /*n_kv=*/5);
  w.KvU32("general.alignment", 32);
  w.KvStr("general.architecture", "llama");
  w.KvU32("llama.block_count", 2);
  w.Str("tokenizer.ggml.tokens");  // array of strings
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(8);
  w.Put<uint64_t>(2);
  w.Str("a");
  w.Str("bc");
  w.Str("nested");  // array of arrays of i32
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(9);
  w.Put<uint64_t>(1);
  w.Put<uint32_t>(5);
  w.Put<uint64_t>(2);
  w.Put<int32_t>(1);
  w.Put<int32_t>(2);
  w.TensorInfo("a.weight", {4, 2}, /*f32*/ 0, 0);
  w.TensorInfo("b.weight", {32, 1}, /*q8_0*/ 8, 32);
  w.Align(32);
  w.Fill(32, 0x11);
  w.Fill(34, 0x22);
  return w.bytes();
}

TEST(GgufFuzzReplay, CommittedInputsParseOrNameTheirError) {
  const std::vector<std::string> inputs = kvtier::fuzz::CorpusFiles("gguf_fuzz");
  ASSERT_FALSE(inputs.empty());
  for (const std::string& input : inputs) {
    const auto* data = reinterpret_cast<const uint8_t*>(input.data());
    ASSERT_EQ(LLVMFuzzerTestOneInput(data, input.size()), 0);
  }
  // The seed is the same file this test builds.
  const std::vector<uint8_t> valid = ValidFile();
  EXPECT_NE(std::find(inputs.begin(), inputs.end(), std::string(valid.begin(), valid.end())),
            inputs.end());
}

TEST(GgufFuzzReplay, MutatedFilesParseOrNameTheirError) {
  const std::vector<uint8_t> base = ValidFile();
  ASSERT_TRUE(kvtier::engine::GgufFile::FromBuffer(base.data(), base.size(), "x").ok());
  std::mt19937_64 rng(20261201);
  int parsed = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b = base;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const size_t at = rng() % b.size();
      switch (rng() % 6) {
        case 0:  // a byte flipped
          b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1: {  // a 64-bit count or length made huge (or zero)
          const uint64_t v = rng() % 2 ? ~0ull >> (rng() % 40) : 0;
          if (at + 8 <= b.size()) std::memcpy(&b[at], &v, 8);
          break;
        }
        case 2:  // cut short
          b.resize(at);
          break;
        case 3:  // a 32-bit tag or type replaced by a small value
          if (at + 4 <= b.size()) {
            const uint32_t v = static_cast<uint32_t>(rng() % 40);
            std::memcpy(&b[at], &v, 4);
          }
          break;
        case 4:  // bytes inserted
          b.insert(b.begin() + static_cast<long>(at), 1 + rng() % 16, static_cast<uint8_t>(rng()));
          break;
        default:  // bytes dropped
          b.erase(b.begin() + static_cast<long>(at),
                  b.begin() + static_cast<long>(std::min(b.size(), at + 1 + rng() % 8)));
      }
      if (b.empty()) break;
    }
    ASSERT_EQ(LLVMFuzzerTestOneInput(b.data(), b.size()), 0);
    (kvtier::engine::GgufFile::FromBuffer(b.data(), b.size(), "fuzz.gguf").ok() ? parsed
                                                                                : refused)++;
  }
  std::printf("files parsed %d, refused with a named error %d\n", parsed, refused);
  EXPECT_GT(parsed, 200);
  EXPECT_GT(refused, 2000);
}

}  // namespace
