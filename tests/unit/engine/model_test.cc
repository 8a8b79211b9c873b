// The forward pass on a tiny synthetic Llama written by the test (mixed weight types), against
// a double-precision reference computed here from the dequantized weights; and the loader's
// errors. Needs no model download.

#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "engine/dense_attention_cache.h"
#include "engine/quant.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "engine/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_model.h"

namespace kvtier::engine {
namespace {

using ::testing::HasSubstr;

using tiny::kContext;
using tiny::kEps;
using tiny::kFfn;
using tiny::kHeadDim;
using tiny::kHeads;
using tiny::kHidden;
using tiny::kKvHeads;
using tiny::kLayers;
using tiny::kRopeBase;
using tiny::kVocab;
using tiny::MakeTensor;
using tiny::MakeWeights;
using tiny::Tensor;
using tiny::WriteModel;

// Double-precision forward over `ids` (positions 0..n-1); last position's logits.
std::vector<double> Reference(const std::map<std::string, Tensor>& w,
                              const std::vector<int32_t>& ids) {
  auto mat = [&](const std::string& name) {
    const Tensor& t = w.at(name);
    std::vector<float> f(t.ne[0] * (t.ne.size() > 1 ? t.ne[1] : 1));
    DequantizeRow(t.type, t.bytes.data(), f.data(), f.size());
    return std::vector<double>(f.begin(), f.end());
  };
  auto matvec = [](const std::vector<double>& m, const std::vector<double>& x, size_t rows) {
    std::vector<double> y(rows);
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < x.size(); ++c) y[r] += m[r * x.size() + c] * x[c];
    return y;
  };
  auto rms = [](const std::vector<double>& x, const std::vector<double>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ss / x.size() + kEps) * g[i];
    return y;
  };
  auto rope = [](std::vector<double>& v, size_t heads, size_t pos) {
    for (size_t h = 0; h < heads; ++h)
      for (size_t i = 0; i < kHeadDim / 2; ++i) {
        double th = pos * std::pow(double(kRopeBase), -2.0 * i / kHeadDim);
        double a = v[h * kHeadDim + 2 * i], b = v[h * kHeadDim + 2 * i + 1];
        v[h * kHeadDim + 2 * i] = a * std::cos(th) - b * std::sin(th);
        v[h * kHeadDim + 2 * i + 1] = a * std::sin(th) + b * std::cos(th);
      }
  };
  const auto emb = mat("token_embd.weight");
  std::vector<std::vector<double>> xs;
  for (int32_t id : ids)
    xs.emplace_back(emb.begin() + id * kHidden, emb.begin() + (id + 1) * kHidden);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto wq = mat(p + "attn_q.weight"), wk = mat(p + "attn_k.weight"),
         wv = mat(p + "attn_v.weight");
    auto wo = mat(p + "attn_output.weight"), g1 = mat(p + "attn_norm.weight");
    auto g2 = mat(p + "ffn_norm.weight"), wg = mat(p + "ffn_gate.weight");
    auto wu = mat(p + "ffn_up.weight"), wd = mat(p + "ffn_down.weight");
    std::vector<std::vector<double>> q, k, v;
    for (size_t t = 0; t < xs.size(); ++t) {
      auto xn = rms(xs[t], g1);
      q.push_back(matvec(wq, xn, kHidden));
      k.push_back(matvec(wk, xn, kKvHeads * kHeadDim));
      v.push_back(matvec(wv, xn, kKvHeads * kHeadDim));
      rope(q.back(), kHeads, t);
      rope(k.back(), kKvHeads, t);
    }
    for (size_t t = 0; t < xs.size(); ++t) {
      std::vector<double> att(kHidden);
      for (uint32_t h = 0; h < kHeads; ++h) {
        const uint32_t kvh = h / (kHeads / kKvHeads);
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          for (uint32_t c = 0; c < kHeadDim; ++c)
            s[j] += q[t][h * kHeadDim + c] * k[j][kvh * kHeadDim + c];
          s[j] /= std::sqrt(double(kHeadDim));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (uint32_t c = 0; c < kHeadDim; ++c)
            att[h * kHeadDim + c] += s[j] / sum * v[j][kvh * kHeadDim + c];
      }
      auto o = matvec(wo, att, kHidden);
      for (uint32_t i = 0; i < kHidden; ++i) xs[t][i] += o[i];
      auto xn = rms(xs[t], g2);
      auto g = matvec(wg, xn, kFfn), u = matvec(wu, xn, kFfn);
      for (uint32_t i = 0; i < kFfn; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      auto d = matvec(wd, g, kHidden);
      for (uint32_t i = 0; i < kHidden; ++i) xs[t][i] += d[i];
    }
  }
  return matvec(emb, rms(xs.back(), mat("output_norm.weight")), kVocab);
}

std::string TempModel(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ModelTest, ForwardMatchesDoubleReferenceOnATinySyntheticLlama) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto weights = MakeWeights(seed);
    const std::string path = TempModel("tiny_llama.gguf");
    WriteModel(path, weights);
    for (int threads : {1, 2}) {
      auto model = Model::Load(path, ModelOptions{threads});
      ASSERT_TRUE(model.ok()) << model.status();
      EXPECT_EQ((*model)->config().head_dim, kHeadDim);
      EXPECT_TRUE((*model)->config().tied_embeddings);
      std::mt19937 rng(seed);
      std::vector<int32_t> ids;
      for (int i = 0; i < 12; ++i) ids.push_back(rng() % kVocab);
      DenseAttentionCache cache((*model)->attention_shape());
      std::vector<float> logits;
      // Prefill 8, then decode 4 (each checked against a full recomputation).
      ASSERT_TRUE((*model)->Prefill(std::span(ids).first(8), cache, &logits).ok());
      for (size_t n = 8; n <= ids.size(); ++n) {
        const auto ref = Reference(weights, std::vector<int32_t>(ids.begin(), ids.begin() + n));
        double scale = 0;
        for (double r : ref) scale = std::max(scale, std::fabs(r));
        for (uint32_t i = 0; i < kVocab; ++i) {
          ASSERT_NEAR(logits[i], ref[i], 2e-4 * scale + 1e-4) << "n=" << n << " id " << i;
        }
        if (n == ids.size()) break;
        DecodeRequest r{ids[n], &cache, &logits};
        ASSERT_TRUE((*model)->Decode(std::span<const DecodeRequest>(&r, 1)).ok());
      }
    }
    std::remove(path.c_str());
  }
}

TEST(ModelTest, RejectsOtherArchitectures) {
  const std::string path = TempModel("gpt2_arch.gguf");
  WriteModel(path, MakeWeights(1), "gpt2");
  auto m = Model::Load(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("unsupported architecture 'gpt2'"));
  std::remove(path.c_str());
}

TEST(ModelTest, RejectsOtherPreTokenizers) {
  const std::string path = TempModel("llama3_pre.gguf");
  WriteModel(path, MakeWeights(1), "llama", "llama-bpe");
  auto m = Model::Load(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("tokenizer.ggml.pre = 'llama-bpe'"));
  std::remove(path.c_str());
}

TEST(ModelTest, RejectsMissingAndMisshapenTensors) {
  const std::string path = TempModel("broken.gguf");
  auto weights = MakeWeights(1);
  weights.erase("blk.1.ffn_up.weight");
  WriteModel(path, weights);
  auto m = Model::Load(path);
  EXPECT_THAT(m.status().message(), HasSubstr("tensor 'blk.1.ffn_up.weight' is missing"));
  weights = MakeWeights(1);
  std::mt19937 rng(1);
  weights["blk.0.attn_k.weight"] = MakeTensor({kHidden, 64}, GgmlType::kF32, rng, 1);
  WriteModel(path, weights);
  m = Model::Load(path);
  EXPECT_THAT(m.status().message(), HasSubstr("has shape [64, 64], expected [64, 32]"));
  std::remove(path.c_str());
}

TEST(ModelTest, EnforcesTheContextLengthAcrossPrefillAndDecode) {
  const std::string path = TempModel("ctx.gguf");
  WriteModel(path, MakeWeights(4));
  auto model = Model::Load(path, ModelOptions{1});
  ASSERT_TRUE(model.ok());
  DenseAttentionCache cache((*model)->attention_shape());
  std::vector<float> logits;
  std::vector<int32_t> ids(kContext, 7);
  ASSERT_TRUE((*model)->Prefill(ids, cache, &logits).ok());
  DecodeRequest r{7, &cache, &logits};
  absl::Status s = (*model)->Decode(std::span<const DecodeRequest>(&r, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds the context length 40"));
  std::remove(path.c_str());
}

// The model the GPU engine test runs on (tests/gpu/engine) in place of the real one: the same
// seed writes the same bytes, the chat template's special tokens encode as one token each, and
// greedy decoding gives the same tokens and bit-identical logits whatever the thread count.
TEST(ModelTest, TinyChatModelLoadsAndDecodesDeterministically) {
  const std::string a = TempModel("tiny_chat_a.gguf"), b = TempModel("tiny_chat_b.gguf");
  tiny::WriteTinyChatModel(a, 7);
  tiny::WriteTinyChatModel(b, 7);
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_EQ(bytes(a), bytes(b)) << "the generator is not deterministic";
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
  };
  std::vector<Run> runs;
  for (int threads : {1, 2}) {
    auto model = Model::Load(threads == 1 ? a : b, ModelOptions{threads});
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string text =
        ApplyChatTemplate(std::vector<ChatMessage>{{"user", "Why is the sky blue?"}}, true);
    const std::vector<int32_t> prompt = (*model)->tokenizer().Encode(text);
    auto occurrences = [&text](const std::string& s) {
      int n = 0;
      for (size_t at = text.find(s); at != std::string::npos; at = text.find(s, at + 1)) ++n;
      return n;
    };
    ASSERT_EQ(prompt.front(), 258) << "<|im_start|> is one token";
    EXPECT_EQ(std::count(prompt.begin(), prompt.end(), 258), occurrences("<|im_start|>"));
    EXPECT_EQ(std::count(prompt.begin(), prompt.end(), 256), occurrences("<|im_end|>"));
    DenseAttentionCache cache((*model)->attention_shape());
    Run run;
    ASSERT_TRUE((*model)->Prefill(prompt, cache, &run.logits).ok());
    for (int step = 0; step < 100; ++step) {
      run.tokens.push_back(Sampler::Argmax(run.logits));
      DecodeRequest r{run.tokens.back(), &cache, &run.logits};
      ASSERT_TRUE((*model)->Decode(std::span<const DecodeRequest>(&r, 1)).ok()) << step;
    }
    runs.push_back(std::move(run));
  }
  EXPECT_EQ(runs[0].tokens, runs[1].tokens);
  ASSERT_EQ(runs[0].logits.size(), kVocab);
  EXPECT_EQ(0, std::memcmp(runs[0].logits.data(), runs[1].logits.data(), kVocab * sizeof(float)));
  // Random weights, not a constant model: the greedy tokens vary.
  EXPECT_GT(std::set<int32_t>(runs[0].tokens.begin(), runs[0].tokens.end()).size(), 3u);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

}  // namespace
}  // namespace kvtier::engine
