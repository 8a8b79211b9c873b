// DESIGN.md §6 on the real model, through the whole worker runtime (scores, the hierarchy
// policy's own decisions, plans, T1 read in place): with r = 0 and γ = 0, the logits of every
// step are bit-identical to the full cache for every β — and they stop being so once r > 0.

#include <cstring>

#include "gtest/gtest.h"
#include "tests/e2e/engine/engine_test_util.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {
namespace {

using worker::SequenceOptions;
using worker::TieredSequence;

SequenceOptions Options(const std::string& policy, double beta, double r, uint64_t prompt) {
  SequenceOptions o;
  o.policy = policy;
  o.prompt_tokens = prompt;
  // A short window and Δ make the policy move pages within a test-sized chain.
  o.tiering.window_tokens = 32;
  o.tiering.retier_interval = 16;
  o.tiering.budgets = {.evict_ratio = r, .hbm_ratio = beta, .compress_ratio = 0};
  return o;
}

TEST(RuntimeZeroErrorTest, HierarchyLogitsAreBitIdenticalToFullForEveryHbmRatio) {
  KVTIER_REQUIRE_MODEL(model, 2);
  auto runtime = worker::WorkerRuntime::Create(
      {.attention = model->attention_shape(), .page_tokens = 8, .arena_bytes = 1ull << 30});
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  const std::vector<int32_t> prompt = model->tokenizer().Encode(ApplyChatTemplate(
      std::vector<ChatMessage>{{"user", "Count from one to twenty in words, one per line."}},
      true));
  struct Run {
    std::string name;
    std::unique_ptr<TieredSequence> seq;
    std::vector<float> logits;
  };
  std::vector<Run> runs;
  runs.push_back({"full", *(*runtime)->Open(Options("full", 1, 0, prompt.size())), {}});
  for (double beta : {0.1, 0.5, 0.8}) {
    runs.push_back({"hierarchy beta=" + std::to_string(beta),
                    *(*runtime)->Open(Options("hierarchy", beta, 0, prompt.size())),
                    {}});
  }
  runs.push_back(
      {"hierarchy r=0.3", *(*runtime)->Open(Options("hierarchy", 0.5, 0.3, prompt.size())), {}});
  for (Run& r : runs) ASSERT_TRUE(model->Prefill(prompt, *r.seq, &r.logits).ok());

  bool lossy_diverged = false;
  for (int step = 0; step < 100; ++step) {
    // Teacher-forced on the full cache's greedy choice, so every run sees the same tokens.
    const int32_t token = static_cast<int32_t>(
        std::max_element(runs[0].logits.begin(), runs[0].logits.end()) - runs[0].logits.begin());
    // One batch: the weights are read once for all runs (the engine's batched rows are
    // bit-identical to single rows, so this compares the caches alone).
    std::vector<DecodeRequest> batch;
    for (Run& r : runs)
      batch.push_back({.token = token, .cache = r.seq.get(), .logits = &r.logits});
    ASSERT_TRUE(model->Decode(batch).ok());
    for (size_t i = 1; i + 1 < runs.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(runs[i].logits.data(), runs[0].logits.data(),
                               runs[0].logits.size() * sizeof(float)))
          << runs[i].name << " differs from full at step " << step;
    }
    lossy_diverged |= std::memcmp(runs.back().logits.data(), runs[0].logits.data(),
                                  runs[0].logits.size() * sizeof(float)) != 0;
  }
  for (size_t i = 1; i + 1 < runs.size(); ++i) {
    const worker::SequenceReport report = runs[i].seq->Report();
    EXPECT_GT(report.offload_bytes, 0u) << runs[i].name << " never offloaded: proves nothing";
    EXPECT_EQ(report.tokens[3], 0u);
  }
  EXPECT_GT(runs.back().seq->Report().tokens[3], 0u);
  EXPECT_TRUE(lossy_diverged) << "eviction changed nothing: the comparison is blind";
}

}  // namespace
}  // namespace kvtier::engine
