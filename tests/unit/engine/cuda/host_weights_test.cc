// The CUDA engine's host half: dequantization to f16 against the CPU engine's dequantization
// (engine/quant) on a tiny synthetic model of every block type and on the real model file, the
// stacked layouts, and the configuration errors. Needs no GPU.

#include "engine/cuda/host_weights.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/model_path.h"
#include "engine/quant.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_model.h"

namespace kvtier::engine::cuda {
namespace {

using ::testing::HasSubstr;

// Half of f16's spacing at x (normal binade of x, or the subnormal step).
double HalfUlpOfHalf(double x) {
  const double a = std::fabs(x);
  if (a < std::ldexp(1.0, -14)) return std::ldexp(1.0, -25);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 11);
}

// The CPU engine's f32 values of a matrix tensor, row-major.
std::vector<float> CpuValues(const GgufTensorInfo& t) {
  std::vector<float> v(t.num_elements);
  const size_t rows = t.ne[1], cols = t.ne[0], row_bytes = t.num_bytes / rows;
  for (size_t r = 0; r < rows; ++r) {
    DequantizeRow(t.type, t.data + r * row_bytes, v.data() + r * cols, cols);
  }
  return v;
}

// Expects rows [first, first + t's rows) of `m` to be `t` rounded to f16 within half an ulp.
void ExpectHalfOf(const HalfMatrix& m, size_t first, const GgufTensorInfo& t) {
  const std::vector<float> cpu = CpuValues(t);
  ASSERT_EQ(m.cols, t.ne[0]) << t.name;
  ASSERT_GE(m.rows, first + t.ne[1]) << t.name;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double half = Fp16ToFp32(m.values[first * m.cols + i]);
    const double err = std::fabs(half - cpu[i]);
    if (err > HalfUlpOfHalf(cpu[i])) {
      FAIL() << t.name << " [" << i / m.cols << ", " << i % m.cols << "]: cpu " << cpu[i] << " f16 "
             << half;
    }
  }
  EXPECT_GT(cpu.size(), 0u);
}

std::string TinyPath() { return ::testing::TempDir() + "/host_weights_tiny.gguf"; }

// The tiny model with one bf16 matrix added to its f32/f16/Q4_0/Q4_1/Q8_0 ones.
std::map<std::string, tiny::Tensor> TinyWeights() {
  auto w = tiny::MakeWeights(5);
  std::mt19937 rng(5);
  w["blk.1.attn_output.weight"] =
      tiny::MakeTensor({tiny::kHidden, tiny::kHidden}, GgmlType::kBF16, rng, 0.1f);
  return w;
}

void ExpectModelWithinHalfUlp(const Model& model) {
  absl::StatusOr<HostWeights> w = DequantizeWeights(model);
  ASSERT_TRUE(w.ok()) << w.status();
  const GgufFile& f = model.file();
  ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(w->token_embd, 0, *f.FindTensor("token_embd.weight")));
  const ModelConfig& c = model.config();
  const size_t qd = size_t{c.num_heads} * c.head_dim, kvd = size_t{c.num_kv_heads} * c.head_dim;
  ASSERT_EQ(w->layers.size(), c.num_layers);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const HostLayerWeights& L = w->layers[l];
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.qkv, 0, *f.FindTensor(p + "attn_q.weight")));
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.qkv, qd, *f.FindTensor(p + "attn_k.weight")));
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.qkv, qd + kvd, *f.FindTensor(p + "attn_v.weight")));
    EXPECT_EQ(L.qkv.rows, qd + 2 * kvd);
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.wo, 0, *f.FindTensor(p + "attn_output.weight")));
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.gate_up, 0, *f.FindTensor(p + "ffn_gate.weight")));
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.gate_up, c.ffn, *f.FindTensor(p + "ffn_up.weight")));
    EXPECT_EQ(L.gate_up.rows, 2 * c.ffn);
    ASSERT_NO_FATAL_FAILURE(ExpectHalfOf(L.down, 0, *f.FindTensor(p + "ffn_down.weight")));
    const GgufTensorInfo* norm = f.FindTensor(p + "attn_norm.weight");
    EXPECT_EQ(0, std::memcmp(L.attn_norm.data(), norm->data, norm->num_bytes)) << p;
  }
  EXPECT_TRUE(w->output.values.empty()) << "tied embeddings need no output matrix";
}

TEST(HostWeightsTest, TinyModelOfEveryBlockTypeIsWithinHalfAnUlpOfTheCpuEngine) {
  tiny::WriteModel(TinyPath(), TinyWeights());
  auto model = Model::Load(TinyPath(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectModelWithinHalfUlp(**model);
  std::remove(TinyPath().c_str());
}

TEST(HostWeightsTest, RealModelIsWithinHalfAnUlpOfTheCpuEngine) {
  if (!std::filesystem::exists(DefaultModelPath())) {
    GTEST_SKIP() << MissingModelHint(DefaultModelPath());
  }
  auto model = Model::Load(DefaultModelPath(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  // What the file holds (REFERENCE.md: Q8_0 embeddings, Q4_1 matrices, f32 norms).
  std::map<std::string, int> types;
  for (const GgufTensorInfo& t : (*model)->file().tensors()) {
    ++types[GetGgmlTypeTraits(static_cast<uint32_t>(t.type))->name];
  }
  for (const auto& [name, n] : types) std::printf("%s: %d tensors\n", name.c_str(), n);
  ExpectModelWithinHalfUlp(**model);
}

TEST(HostWeightsTest, BytesCountEveryUploadedValue) {
  tiny::WriteModel(TinyPath(), TinyWeights());
  auto model = Model::Load(TinyPath(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  auto w = DequantizeWeights(**model);
  ASSERT_TRUE(w.ok()) << w.status();
  uint64_t halves = 0, floats = 0;
  for (const GgufTensorInfo& t : (*model)->file().tensors()) {
    (t.ne.size() == 2 ? halves : floats) += t.num_elements;
  }
  EXPECT_EQ(w->Bytes(), 2 * halves + 4 * floats);
  std::remove(TinyPath().c_str());
}

TEST(HostWeightsTest, ValueOutsideHalfRangeIsRejectedNamingTensorAndType) {
  auto weights = TinyWeights();
  const uint16_t big = 0x4974;  // bf16 bits of 999,424: finite in bf16, not in f16
  std::memcpy(weights["blk.1.attn_output.weight"].bytes.data() + 2 * 70, &big, 2);
  tiny::WriteModel(TinyPath(), weights);
  auto model = Model::Load(TinyPath(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<HostWeights> w = DequantizeWeights(**model);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("tensor 'blk.1.attn_output.weight' (bf16)"));
  EXPECT_THAT(w.status().message(), HasSubstr("at [1, 6] does not fit f16"));
  std::remove(TinyPath().c_str());
}

TEST(HostWeightsTest, NonMatrixIsRejectedNamingTensorAndType) {
  tiny::WriteModel(TinyPath(), TinyWeights());
  auto model = Model::Load(TinyPath(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<HalfMatrix> m =
      DequantizeToHalf(*(*model)->file().FindTensor("output_norm.weight"));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              HasSubstr("tensor 'output_norm.weight' (f32): shape [64] is not a matrix"));
  std::remove(TinyPath().c_str());
}

TEST(HostWeightsTest, UnsupportedTypeFailsTheLoadNamingTensorAndType) {
  // CudaModel::Create takes a loaded Model: a type neither engine dequantizes stops there.
  auto weights = TinyWeights();
  tiny::Tensor& t = weights["blk.0.ffn_up.weight"];
  t.type = static_cast<GgmlType>(7);                // Q5_1: 24 bytes per 32 values
  t.bytes.assign(t.bytes.size() / 2 / 32 * 24, 0);  // was f16
  tiny::WriteModel(TinyPath(), weights);
  auto model = Model::Load(TinyPath(), {.threads = 1});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr("tensor 'blk.0.ffn_up.weight': ggml tensor type 7 is not supported"));
  std::remove(TinyPath().c_str());
}

}  // namespace
}  // namespace kvtier::engine::cuda
