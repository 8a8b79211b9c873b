#include "engine/gguf.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gguf_writer.h"

namespace kvtier::engine {
namespace {

using ::testing::HasSubstr;

// A small valid file: every metadata type, a nested array, two tensors, alignment 64.
std::vector<uint8_t> MakeValidFile() {
  GgufWriter w;
  w.Header(2, 15);
  w.KvStr("general.architecture", "llama");
  w.KvU32("general.alignment", 64);
  w.Str("u8");
  w.Put<uint32_t>(0);
  w.Put<uint8_t>(200);
  w.Str("i8");
  w.Put<uint32_t>(1);
  w.Put<int8_t>(-5);
  w.Str("u16");
  w.Put<uint32_t>(2);
  w.Put<uint16_t>(60000);
  w.Str("i16");
  w.Put<uint32_t>(3);
  w.Put<int16_t>(-300);
  w.Str("i32");
  w.Put<uint32_t>(5);
  w.Put<int32_t>(-70000);
  w.Str("f32");
  w.Put<uint32_t>(6);
  w.Put<float>(1.5f);
  w.Str("bool");
  w.Put<uint32_t>(7);
  w.Put<uint8_t>(1);
  w.Str("u64");
  w.Put<uint32_t>(10);
  w.Put<uint64_t>(1ull << 40);
  w.Str("i64");
  w.Put<uint32_t>(11);
  w.Put<int64_t>(-(1ll << 40));
  w.Str("f64");
  w.Put<uint32_t>(12);
  w.Put<double>(0.25);
  // array of strings
  w.Str("strs");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(8);
  w.Put<uint64_t>(3);
  w.Str("a");
  w.Str("");
  w.Str("ccc");
  // array of arrays of i32: [[1,2],[3]]
  w.Str("nested");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(9);
  w.Put<uint64_t>(2);
  w.Put<uint32_t>(5);
  w.Put<uint64_t>(2);
  w.Put<int32_t>(1);
  w.Put<int32_t>(2);
  w.Put<uint32_t>(5);
  w.Put<uint64_t>(1);
  w.Put<int32_t>(3);
  w.Str("empty");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(6);
  w.Put<uint64_t>(0);
  w.TensorInfo("a.weight", {4, 2}, 0, 0);    // f32, 32 bytes
  w.TensorInfo("b.weight", {32, 1}, 8, 64);  // q8_0, 34 bytes
  w.Align(64);
  w.Fill(32, 0x11);
  w.Fill(32, 0);
  w.Fill(34, 0x22);  // last tensor ends exactly at end of file
  return w.bytes();
}

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::vector<uint8_t>& b, size_t n = ~0ul) {
  return GgufFile::FromBuffer(b.data(), std::min(n, b.size()), "synthetic.gguf");
}

TEST(GgufTest, ParsesEveryValueTypeAndNestedArrays) {
  std::vector<uint8_t> b = MakeValidFile();
  auto f = Parse(b);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetUint("u8"), 200u);
  EXPECT_EQ(std::get<int64_t>((*f)->Find("i8")->value), -5);
  EXPECT_EQ(*(*f)->GetUint("u16"), 60000u);
  EXPECT_EQ(std::get<int64_t>((*f)->Find("i16")->value), -300);
  EXPECT_EQ(std::get<int64_t>((*f)->Find("i32")->value), -70000);
  EXPECT_FLOAT_EQ(*(*f)->GetFloat("f32"), 1.5f);
  EXPECT_TRUE(*(*f)->Find("bool")->AsBool());
  EXPECT_EQ(*(*f)->GetUint("u64"), 1ull << 40);
  EXPECT_EQ(std::get<int64_t>((*f)->Find("i64")->value), -(1ll << 40));
  EXPECT_DOUBLE_EQ(*(*f)->GetFloat("f64"), 0.25);
  const GgufArray* strs = *(*f)->Find("strs")->AsArray();
  ASSERT_EQ(strs->size(), 3u);
  EXPECT_EQ(*(*strs)[2].AsString(), "ccc");
  EXPECT_EQ(*(*strs)[1].AsString(), "");
  const GgufArray* nested = *(*f)->Find("nested")->AsArray();
  ASSERT_EQ(nested->size(), 2u);
  EXPECT_EQ((*nested->at(0).AsArray())->size(), 2u);
  EXPECT_EQ(*(*nested->at(1).AsArray())->at(0).AsUint(), 3u);
  EXPECT_EQ((*(*f)->Find("empty")->AsArray())->size(), 0u);
  EXPECT_EQ((*f)->metadata_keys().size(), 15u);
}

TEST(GgufTest, TensorsPointIntoDataSectionAtAlignment) {
  std::vector<uint8_t> b = MakeValidFile();
  auto f = Parse(b);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const GgufTensorInfo* a = (*f)->FindTensor("a.weight");
  const GgufTensorInfo* q = (*f)->FindTensor("b.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(a->num_elements, 8u);
  EXPECT_EQ(a->num_bytes, 32u);
  EXPECT_EQ(q->num_bytes, 34u);
  EXPECT_EQ(q->type, GgmlType::kQ8_0);
  EXPECT_EQ((a->data - b.data()) % 64, 0);
  EXPECT_EQ(q->data - a->data, 64);
  EXPECT_EQ(a->data[0], 0x11);
  EXPECT_EQ(q->data[33], 0x22);
  EXPECT_EQ((*f)->FindTensor("missing"), nullptr);
}

TEST(GgufTest, EveryTruncationIsAnInvalidArgumentNamingTheOffset) {
  std::vector<uint8_t> b = MakeValidFile();
  for (size_t n = 0; n < b.size(); ++n) {
    auto f = Parse(b, n);
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr("synthetic.gguf")) << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr("offset")) << f.status();
  }
}

TEST(GgufTest, RandomCorruptionNeverCrashes) {
  std::vector<uint8_t> good = MakeValidFile();
  std::srand(7);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = good;
    int flips = 1 + std::rand() % 3;
    for (int k = 0; k < flips; ++k) b[std::rand() % 300] ^= 1 << (std::rand() % 8);
    auto f = Parse(b);  // may succeed (e.g. a flipped value byte); must not crash or hang
    if (!f.ok()) {
      EXPECT_FALSE(f.status().message().empty());
    }
  }
}

TEST(GgufTest, RejectsBadMagic) {
  std::vector<uint8_t> b = MakeValidFile();
  b[0] = 'X';
  auto f = Parse(b);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("bad magic"));
}

TEST(GgufTest, RejectsOtherVersions) {
  std::vector<uint8_t> b = MakeValidFile();
  b[4] = 2;
  auto f = Parse(b);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("unsupported GGUF version 2"));
}

TEST(GgufTest, RejectsUnknownValueType) {
  GgufWriter w;
  w.Header(0, 1);
  w.Str("k");
  w.Put<uint32_t>(13);
  w.Put<uint32_t>(0);
  auto f = Parse(w.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("unknown value type 13"));
  EXPECT_THAT(f.status().message(), HasSubstr("offset 33"));
}

TEST(GgufTest, RejectsBoolOtherThanZeroOrOne) {
  GgufWriter w;
  w.Header(0, 1);
  w.Str("k");
  w.Put<uint32_t>(7);
  w.Put<uint8_t>(2);
  auto f = Parse(w.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("bool value 2"));
}

TEST(GgufTest, RejectsHugeArrayCountWithoutAllocating) {
  GgufWriter w;
  w.Header(0, 1);
  w.Str("k");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(0);
  w.Put<uint64_t>(1ull << 60);
  auto f = Parse(w.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("array of"));
}

TEST(GgufTest, RejectsDeeplyNestedArrays) {
  GgufWriter w;
  w.Header(0, 1);
  w.Str("k");
  w.Put<uint32_t>(9);
  for (int i = 0; i < 20; ++i) {
    w.Put<uint32_t>(9);
    w.Put<uint64_t>(1);
  }
  w.Fill(64, 0);
  auto f = Parse(w.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("nested"));
}

struct TensorCase {
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
  const char* error;
};

TEST(GgufTest, RejectsBadTensorInfos) {
  const TensorCase cases[] = {
      {{32}, 99, 0, "ggml tensor type 99 is not supported"},
      {{32}, 0, 4, "not a multiple of alignment 32"},
      {{20}, 8, 0, "not a multiple of the q8_0 block size 32"},
      {{}, 0, 0, "n_dims 0"},
      {{1, 1, 1, 1, 1}, 0, 0, "n_dims 5"},
      {{0}, 0, 0, "dimension 0 = 0"},
      {{1024}, 0, 0, "truncated: tensor 't'"},
  };
  for (const TensorCase& c : cases) {
    GgufWriter w;
    w.Header(1, 0);
    w.TensorInfo("t", c.ne, c.type, c.offset);
    w.Align(32);
    w.Fill(128, 0);
    auto f = Parse(w.bytes());
    ASSERT_FALSE(f.ok()) << c.error;
    EXPECT_THAT(f.status().message(), HasSubstr(c.error));
  }
}

TEST(GgufTest, RejectsOverlappingTensorsAndDuplicates) {
  GgufWriter w;
  w.Header(2, 0);
  w.TensorInfo("a", {16}, 0, 0);
  w.TensorInfo("b", {16}, 0, 32);
  w.Align(32);
  w.Fill(96, 0);
  auto f = Parse(w.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("overlaps"));

  GgufWriter d;
  d.Header(2, 0);
  d.TensorInfo("a", {8}, 0, 0);
  d.TensorInfo("a", {8}, 0, 32);
  d.Align(32);
  d.Fill(64, 0);
  f = Parse(d.bytes());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("duplicate tensor name 'a'"));
}

TEST(GgufTest, TypedGettersReportMissingAndMismatchedKeys) {
  std::vector<uint8_t> b = MakeValidFile();
  auto f = Parse(b);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetUint("nope").status().code(), absl::StatusCode::kNotFound);
  auto s = (*f)->GetUint("general.architecture");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("string"));
  EXPECT_FALSE((*f)->GetUint("i64").ok());  // negative
}

TEST(GgufTest, OpenMapsAFileAndReportsMissingOnes) {
  std::vector<uint8_t> b = MakeValidFile();
  std::string path = ::testing::TempDir() + "/gguf_test_file.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), b.size());
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->file_size(), b.size());
  EXPECT_EQ((*f)->FindTensor("b.weight")->data[0], 0x22);
  std::remove(path.c_str());
  auto missing = GgufFile::Open(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace kvtier::engine
