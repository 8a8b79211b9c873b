// The engine on the real model: configuration read from the file, batching and threading
// invariances (bit-exact), memory footprint, bad input.

#include <fstream>
#include <string>

#include "engine/dense_attention_cache.h"
#include "engine/sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/engine/engine_test_util.h"

namespace kvtier::engine {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> Prompt(const Model& m, const std::string& user) {
  std::vector<ChatMessage> msgs = {{"user", user}};
  return m.tokenizer().Encode(ApplyChatTemplate(msgs, true));
}

absl::Status DecodeOne(Model& m, int32_t token, DenseAttentionCache& cache,
                       std::vector<float>& logits) {
  DecodeRequest r{token, &cache, &logits};
  return m.Decode(std::span<const DecodeRequest>(&r, 1));
}

TEST(ModelE2eTest, ReadsSmolLm2ConfigurationFromTheFile) {
  KVTIER_REQUIRE_MODEL(model, 2);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30u);
  EXPECT_EQ(c.hidden, 576u);
  EXPECT_EQ(c.num_heads, 9u);
  EXPECT_EQ(c.num_kv_heads, 3u);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.ffn, 1536u);
  EXPECT_EQ(c.vocab_size, 49152u);
  EXPECT_EQ(c.context_length, 8192u);
  EXPECT_FLOAT_EQ(c.rope_base, 100000.f);
  EXPECT_NEAR(c.rms_eps, 1e-5f, 1e-9f);
  EXPECT_TRUE(c.tied_embeddings);
  const GgufFile& f = model->file();
  EXPECT_EQ(f.tensors().size(), 272u);
  int q41 = 0, f32 = 0;
  for (const auto& t : f.tensors()) {
    q41 += t.type == GgmlType::kQ4_1;
    f32 += t.type == GgmlType::kF32;
  }
  EXPECT_EQ(q41, 210);
  EXPECT_EQ(f32, 61);
  EXPECT_EQ(f.FindTensor("token_embd.weight")->type, GgmlType::kQ8_0);
  EXPECT_FLOAT_EQ(model->attention_shape().scale, 0.125f);
}

// Each output is one fused dot product over the same inputs, and attention for a query does
// not depend on how many queries share the call: prefilling N tokens equals prefilling N-k and
// decoding k, bit for bit.
TEST(ModelE2eTest, PrefillEqualsPrefixPrefillPlusDecodeBitExact) {
  KVTIER_REQUIRE_MODEL(model, 2);
  std::vector<int32_t> ids = Prompt(*model, "Name three colours.");
  DenseAttentionCache full(model->attention_shape()), split(model->attention_shape());
  std::vector<float> a, b;
  ASSERT_TRUE(model->Prefill(ids, full, &a).ok());
  const size_t k = 5;
  ASSERT_TRUE(model->Prefill(std::span(ids).first(ids.size() - k), split, &b).ok());
  for (size_t i = ids.size() - k; i < ids.size(); ++i) {
    ASSERT_TRUE(DecodeOne(*model, ids[i], split, b).ok());
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(full.Length(0), ids.size());
  EXPECT_EQ(split.Length(29), ids.size());
}

TEST(ModelE2eTest, BatchedDecodeEqualsSequentialDecodeBitExact) {
  KVTIER_REQUIRE_MODEL(model, 2);
  const char* users[] = {"Hi!", "Count to five.", "What is 2+2?"};
  std::vector<std::unique_ptr<DenseAttentionCache>> batched, alone;
  std::vector<std::vector<float>> lb(3), la(3);
  for (int s = 0; s < 3; ++s) {
    auto ids = Prompt(*model, users[s]);
    batched.push_back(std::make_unique<DenseAttentionCache>(model->attention_shape()));
    alone.push_back(std::make_unique<DenseAttentionCache>(model->attention_shape()));
    ASSERT_TRUE(model->Prefill(ids, *batched[s], &lb[s]).ok());
    ASSERT_TRUE(model->Prefill(ids, *alone[s], &la[s]).ok());
  }
  for (int step = 0; step < 8; ++step) {
    std::vector<DecodeRequest> reqs;
    for (int s = 0; s < 3; ++s) reqs.push_back({Sampler::Argmax(lb[s]), batched[s].get(), &lb[s]});
    ASSERT_TRUE(model->Decode(reqs).ok());
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(DecodeOne(*model, Sampler::Argmax(la[s]), *alone[s], la[s]).ok());
      ASSERT_EQ(lb[s], la[s]) << "sequence " << s << " step " << step;
    }
  }
}

TEST(ModelE2eTest, ThreadCountDoesNotChangeLogits) {
  KVTIER_REQUIRE_MODEL(one, 1);
  KVTIER_REQUIRE_MODEL(two, 2);
  auto ids = Prompt(*one, "Why is the sky blue?");
  DenseAttentionCache c1(one->attention_shape()), c2(two->attention_shape());
  std::vector<float> l1, l2;
  ASSERT_TRUE(one->Prefill(ids, c1, &l1).ok());
  ASSERT_TRUE(two->Prefill(ids, c2, &l2).ok());
  EXPECT_EQ(l1, l2);
}

TEST(ModelE2eTest, ScalarKernelsAgreeWithVectorKernels) {
  KVTIER_REQUIRE_MODEL(model, 2);
  if (model->isa() == KernelIsa::kScalar) GTEST_SKIP() << "no vector kernels on this CPU";
  auto scalar = Model::Load(DefaultModelPath(), ModelOptions{2, KernelIsa::kScalar});
  ASSERT_TRUE(scalar.ok());
  auto ids = Prompt(*model, "Hello");
  DenseAttentionCache c1(model->attention_shape()), c2(model->attention_shape());
  std::vector<float> l1, l2;
  ASSERT_TRUE(model->Prefill(ids, c1, &l1).ok());
  ASSERT_TRUE((*scalar)->Prefill(ids, c2, &l2).ok());
  float worst = 0;
  for (size_t i = 0; i < l1.size(); ++i) worst = std::max(worst, std::fabs(l1[i] - l2[i]));
  EXPECT_LT(worst, 2e-3f);  // f32 summation order only
  EXPECT_EQ(Sampler::Argmax(l1), Sampler::Argmax(l2));
}

// Every step's attention weights sum to 1 per layer and head, so the averaged mass is 1; a
// prefill of n tokens seeds n (one per query).
TEST(ModelE2eTest, PositionMassIsANormalisedAttentionScore) {
  KVTIER_REQUIRE_MODEL(model, 2);
  auto ids = Prompt(*model, "Tell me a joke.");
  DenseAttentionCache cache(model->attention_shape());
  std::vector<float> logits, mass;
  ASSERT_TRUE(model->Prefill(ids, cache, &logits, &mass).ok());
  ASSERT_EQ(mass.size(), ids.size());
  double sum = 0;
  for (float m : mass) sum += m;
  EXPECT_NEAR(sum, ids.size(), 1e-3 * ids.size());
  DecodeRequest r{Sampler::Argmax(logits), &cache, &logits, &mass};
  ASSERT_TRUE(model->Decode(std::span<const DecodeRequest>(&r, 1)).ok());
  ASSERT_EQ(mass.size(), ids.size() + 1);
  sum = 0;
  for (float m : mass) {
    EXPECT_GE(m, 0.f);
    sum += m;
  }
  EXPECT_NEAR(sum, 1.0, 1e-4);
}

size_t ResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Weights stay quantized in the mapping: loading and running the model adds at most 1.5× the
// file size to the resident set, plus the KV cache.
TEST(ModelE2eTest, ResidentMemoryStaysWithinOneAndAHalfFileSizesPlusKv) {
  if (!std::filesystem::exists(DefaultModelPath())) {
    GTEST_SKIP() << MissingModelHint(DefaultModelPath());
  }
  const size_t before = ResidentBytes();
  auto model = Model::Load(DefaultModelPath(), ModelOptions{2});
  ASSERT_TRUE(model.ok());
  auto ids = Prompt(**model, "Write a haiku about memory.");
  DenseAttentionCache cache((*model)->attention_shape());
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Prefill(ids, cache, &logits).ok());
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(DecodeOne(**model, Sampler::Argmax(logits), cache, logits).ok());
  }
  const size_t added = ResidentBytes() - before;
  const size_t file = (*model)->file().file_size();
  std::printf("resident +%.1f MiB for a %.1f MiB file and %.2f MiB of KV\n", added / 1048576.0,
              file / 1048576.0, cache.bytes() / 1048576.0);
  EXPECT_LE(added, file * 3 / 2 + cache.bytes());
}

TEST(ModelE2eTest, PromptLongerThanContextIsAClearError) {
  KVTIER_REQUIRE_MODEL(model, 2);
  std::vector<int32_t> ids(model->config().context_length + 1, 42);
  DenseAttentionCache cache(model->attention_shape());
  std::vector<float> logits;
  absl::Status s = model->Prefill(ids, cache, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds the context length 8192"));
  EXPECT_EQ(cache.Length(0), 0u);  // nothing appended
}

TEST(ModelE2eTest, BadTokensAndSharedCachesAreRejected) {
  KVTIER_REQUIRE_MODEL(model, 2);
  DenseAttentionCache cache(model->attention_shape());
  std::vector<float> logits;
  std::vector<int32_t> bad = {1, 49152};
  EXPECT_THAT(model->Prefill(bad, cache, &logits).message(), HasSubstr("token id 49152"));
  EXPECT_FALSE(model->Prefill({}, cache, &logits).ok());
  DecodeRequest r[2] = {{5, &cache, &logits}, {6, &cache, &logits}};
  EXPECT_THAT(model->Decode(r).message(), HasSubstr("share a cache"));
  EXPECT_EQ(cache.Length(0), 0u);
}

TEST(ModelE2eTest, GeneratesACoherentAnswer) {
  KVTIER_REQUIRE_MODEL(model, 2);
  auto ids = Prompt(*model, "What is the capital of France?");
  DenseAttentionCache cache(model->attention_shape());
  std::vector<float> logits;
  ASSERT_TRUE(model->Prefill(ids, cache, &logits).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < 24; ++i) {
    int32_t t = Sampler::Argmax(logits);
    if (model->tokenizer().IsEndOfGeneration(t)) break;
    out.push_back(t);
    ASSERT_TRUE(DecodeOne(*model, t, cache, logits).ok());
  }
  EXPECT_THAT(model->tokenizer().Decode(out), HasSubstr("Paris"));
}

TEST(ModelLoadTest, MissingFileSaysHowToGetTheModel) {
  auto m = Model::Load("/nonexistent/dir/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("scripts/install-deps"));
}

}  // namespace
}  // namespace kvtier::engine
