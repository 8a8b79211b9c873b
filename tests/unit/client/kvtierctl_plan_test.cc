#include <cstdio>
#include <fstream>
#include <string>

#include "client/kvtierctl/model_source.h"
#include "core/planning/models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/gguf_writer.h"

namespace kvtier::ctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/kvtierctl_plan_test_" + name;
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A GGUF file of metadata only (no tensors), Qwen2.5 7B's geometry under llama.cpp's keys.
std::string QwenGguf(bool with_kv_heads) {
  engine::GgufWriter w;
  w.Header(0, with_kv_heads ? 5 : 4);
  w.KvStr("general.architecture", "qwen2");
  w.KvU32("qwen2.block_count", 28);
  w.KvU32("qwen2.attention.head_count", 28);
  if (with_kv_heads) w.KvU32("qwen2.attention.head_count_kv", 4);
  w.KvU32("qwen2.embedding_length", 3584);
  return std::string(w.bytes().begin(), w.bytes().end());
}

TEST(KvtierctlPlanTest, ReadsGeometryFromGgufMetadata) {
  auto m = LoadModel(WriteFile("qwen.gguf", QwenGguf(true)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_layers, 28u);
  EXPECT_EQ(m->num_heads, 28u);
  EXPECT_EQ(m->num_kv_heads, 4u);
  EXPECT_EQ(m->head_dim, 128u);  // embedding_length / head_count without key_length
  EXPECT_GT(m->weight_bytes, 0);
}

TEST(KvtierctlPlanTest, ReadsGgufOfKQuantTensorsAndTokenizerArrays) {
  // What a published Q4_K_M file looks like to the planner: a string array (the vocabulary), an
  // i32 array, and tensors of a type the engine's reader does not know (Q4_K = 12).
  engine::GgufWriter w;
  w.Header(1, 7);
  w.KvStr("general.architecture", "llama");
  w.Str("tokenizer.ggml.tokens");
  w.Put<uint32_t>(9);  // array
  w.Put<uint32_t>(8);  // of strings
  w.Put<uint64_t>(3);
  for (const char* t : {"<s>", "a", "bc"}) w.Str(t);
  w.Str("tokenizer.ggml.token_type");
  w.Put<uint32_t>(9);
  w.Put<uint32_t>(5);  // of i32
  w.Put<uint64_t>(3);
  for (int32_t t : {1, 2, 3}) w.Put<int32_t>(t);
  w.KvU32("llama.block_count", 32);
  w.KvU32("llama.attention.head_count", 32);
  w.KvU32("llama.attention.head_count_kv", 8);
  w.KvU32("llama.embedding_length", 4096);
  w.TensorInfo("blk.0.attn_q.weight", {256, 1}, 12, 0);
  w.Align(32);
  w.Fill(144, 0);
  auto m = LoadModel(WriteFile("q4k.gguf", std::string(w.bytes().begin(), w.bytes().end())));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_layers, 32u);
  EXPECT_EQ(m->num_kv_heads, 8u);
  EXPECT_EQ(m->head_dim, 128u);
}

TEST(KvtierctlPlanTest, GgufWithoutKvHeadsIsMha) {
  auto m = LoadModel(WriteFile("mha.gguf", QwenGguf(false)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_kv_heads, 28u);
}

TEST(KvtierctlPlanTest, HfConfigOfLlama3With8BMatchesTheBuiltin) {
  // meta-llama/Meta-Llama-3-8B's config.json, the fields that matter.
  const std::string config = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})";
  auto m = LoadModel(WriteFile("config.json", config));
  ASSERT_TRUE(m.ok()) << m.status();
  const planning::ModelGeometry builtin = *planning::FindBuiltinModel("llama3-8b");
  EXPECT_EQ(m->num_layers, builtin.num_layers);
  EXPECT_EQ(m->num_heads, builtin.num_heads);
  EXPECT_EQ(m->num_kv_heads, builtin.num_kv_heads);
  EXPECT_EQ(m->head_dim, builtin.head_dim);
  EXPECT_DOUBLE_EQ(m->weight_bytes, builtin.weight_bytes);
}

TEST(KvtierctlPlanTest, BadModelsAreErrorsNamingWhatIsWrong) {
  auto missing = ParseHfConfig(R"({"num_hidden_layers": 32, "hidden_size": 4096})", "c.json");
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(HasSubstr("c.json"), HasSubstr("num_attention_heads")));
  auto zero = ParseHfConfig(R"({"num_hidden_layers": 0})", "c.json");
  EXPECT_THAT(std::string(zero.status().message()),
              AllOf(HasSubstr("num_hidden_layers"), HasSubstr("[1, 4294967295]"), HasSubstr("0")));
  auto mla = ParseHfConfig(R"({"kv_lora_rank": 512, "num_hidden_layers": 61})", "ds.json");
  EXPECT_THAT(std::string(mla.status().message()), HasSubstr("kv_lora_rank"));
  EXPECT_FALSE(ParseHfConfig("not json", "x.json").ok());

  auto unknown = LoadModel("llama-9000");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              AllOf(HasSubstr("llama-9000"), HasSubstr("llama3-8b")));
  EXPECT_EQ(LoadModel("/no/such/model.gguf").status().code(), absl::StatusCode::kNotFound);

  std::string truncated = QwenGguf(true);
  truncated.resize(truncated.size() - 3);
  EXPECT_THAT(std::string(LoadModel(WriteFile("truncated.gguf", truncated)).status().message()),
              HasSubstr("truncated.gguf"));
  engine::GgufWriter no_layers;
  no_layers.Header(0, 1);
  no_layers.KvStr("general.architecture", "llama");
  auto missing_key = LoadModel(
      WriteFile("nolayers.gguf", std::string(no_layers.bytes().begin(), no_layers.bytes().end())));
  EXPECT_THAT(std::string(missing_key.status().message()), HasSubstr("llama.block_count"));
}

TEST(KvtierctlPlanTest, ParsesMeminfo) {
  auto mem = ParseMeminfo("MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n");
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(mem->total_bytes, 16384u * 1024);
  EXPECT_EQ(mem->available_bytes, 8192u * 1024);
  EXPECT_FALSE(ParseMeminfo("MemFree: 1 kB\n").ok());
}

}  // namespace
}  // namespace kvtier::ctl
