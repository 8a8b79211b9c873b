// The runtime end to end in local mode: sequences score, re-tier and keep the zero-error
// property through hundreds of decode steps.

#include "worker/runtime/tiered_sequence.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/support/synthetic_engine.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker {
namespace {

using testing::SyntheticEngine;
using tiering::Tier;

AttentionShape Shape() {
  return {.num_layers = 4, .num_q_heads = 6, .num_kv_heads = 2, .head_dim = 32, .scale = 0};
}

std::unique_ptr<WorkerRuntime> LocalRuntime(uint32_t page_tokens) {
  auto r = WorkerRuntime::Create({.attention = Shape(),
                                  .page_tokens = page_tokens,
                                  .arena_bytes = 256 << 20,
                                  .local_ddr_bytes = 64 << 20,
                                  .local_compressed_bytes = 32 << 20});
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

SequenceOptions Options(const std::string& policy, double beta, double r, double gamma,
                        uint64_t prompt) {
  SequenceOptions o;
  o.policy = policy;
  o.prompt_tokens = prompt;
  o.tiering.window_tokens = 32;
  o.tiering.retier_interval = 16;
  o.tiering.budgets = {.evict_ratio = r, .hbm_ratio = beta, .compress_ratio = gamma};
  return o;
}

// Runs prefill + `steps` decode passes on `seq`, returning every attention output.
std::vector<float> Decode(TieredSequence& seq, uint64_t prompt, int steps, uint64_t seed) {
  SyntheticEngine engine(Shape(), seed);
  std::vector<float> out;
  EXPECT_TRUE(engine.Forward(seq, prompt, &out).ok());
  for (int i = 0; i < steps; ++i) {
    absl::Status s = engine.Forward(seq, 1, &out);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  return out;
}

TEST(TieredSequenceTest, HierarchyWithoutLossIsBitIdenticalToFullForEveryHbmRatio) {
  std::mt19937 rng(3);
  for (uint32_t page_tokens : {1u, 4u, 16u}) {
    auto runtime = LocalRuntime(page_tokens);
    const uint64_t prompt = 10 + rng() % 30;
    auto full = runtime->Open(Options("full", 1, 0, 0, prompt));
    ASSERT_TRUE(full.ok()) << full.status();
    const std::vector<float> reference = Decode(**full, prompt, 200, page_tokens);
    for (double beta : {0.0, 0.3, 0.7}) {
      auto tiered = runtime->Open(Options("hierarchy", beta, 0, 0, prompt));
      ASSERT_TRUE(tiered.ok()) << tiered.status();
      const std::vector<float> got = Decode(**tiered, prompt, 200, page_tokens);
      ASSERT_EQ(got.size(), reference.size());
      EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)))
          << "page_tokens=" << page_tokens << " beta=" << beta;
      SequenceReport report = (*tiered)->Report();
      if (beta < 0.7) {
        EXPECT_GT(report.offload_bytes, 0u) << "nothing was offloaded: the test proves nothing";
      }
      EXPECT_EQ(report.tokens[static_cast<int>(Tier::kT3)], 0u);
      EXPECT_LT(report.t0_mean_bytes, report.full_mean_bytes + 1);
    }
  }
}

TEST(TieredSequenceTest, EvictionChangesOutputsAndIsReportedCumulatively) {
  auto runtime = LocalRuntime(4);
  auto full = runtime->Open(Options("full", 1, 0, 0, 16));
  auto evicting = runtime->Open(Options("hierarchy", 0.5, 0.2, 0, 16));
  ASSERT_TRUE(full.ok() && evicting.ok());
  const std::vector<float> a = Decode(**full, 16, 250, 11);
  const std::vector<float> b = Decode(**evicting, 16, 250, 11);
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  SequenceReport r = (*evicting)->Report();
  EXPECT_GT(r.tokens[static_cast<int>(Tier::kT3)], 0u);
  // r applies to eligible tokens (generated, not protected): the generated share is below r.
  EXPECT_GT(r.evicted_generated_fraction, 0.0);
  EXPECT_LE(r.evicted_generated_fraction, 0.2 + 1e-9);
  EXPECT_GT(r.plans, 10u);
  EXPECT_EQ(r.length, 16u + 250u);
}

TEST(TieredSequenceTest, CompressedPagesCarrySmallBoundedError) {
  auto runtime = LocalRuntime(4);
  auto full = runtime->Open(Options("full", 1, 0, 0, 16));
  auto compressed = runtime->Open(Options("hierarchy", 0.3, 0, 0.5, 16));
  ASSERT_TRUE(full.ok() && compressed.ok());
  const std::vector<float> a = Decode(**full, 16, 150, 5);
  const std::vector<float> b = Decode(**compressed, 16, 150, 5);
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
  EXPECT_GT(max_diff, 0.0);  // T2 is lossy...
  EXPECT_LT(max_diff, 0.1);  // ...but 8-bit close (values are in [-3, 3])
  EXPECT_GT((*compressed)->Report().compress_bytes, 0u);
}

TEST(TieredSequenceTest, ClosingReturnsEverySlot) {
  auto runtime = LocalRuntime(4);
  {
    auto seq = runtime->Open(Options("hierarchy", 0.2, 0, 0.3, 8));
    ASSERT_TRUE(seq.ok());
    Decode(**seq, 8, 100, 2);
    EXPECT_GT((*seq)->Report().ddr_bytes + (*seq)->Report().compressed_bytes, 0u);
  }
  EXPECT_EQ(runtime->arena().used_bytes(), 0u);
}

TEST(TieredSequenceTest, RejectsWorkerOnlyPoliciesAndBadBudgets) {
  auto runtime = LocalRuntime(16);
  auto h2o = runtime->Open(Options("h2o", 0.5, 0.1, 0, 8));
  EXPECT_EQ(h2o.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = runtime->Open(Options("hierarchy", 1.5, 0, 0, 8));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hbm_ratio"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace kvtier::worker
