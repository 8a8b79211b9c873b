#include "worker/cuda/decoder_config.h"

#include <algorithm>
#include <random>
#include <string>

#include "core/tiering/policy.h"
#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

using tiering::Tier;

AttentionShape Shape() {
  return {.num_layers = 3, .num_q_heads = 8, .num_kv_heads = 2, .head_dim = 64, .scale = 0.125f};
}

// The GPU test's options (tests/gpu/cuda/gpu_decoder_gpu_test.cc).
DecoderOptions Options(KvMode mode, double evict) {
  DecoderOptions o;
  o.batch = 3;
  o.context_tokens = 700;
  o.max_new_tokens = 8;
  o.mode = mode;
  o.tiering.evict_ratio = evict;
  o.tiering.prompt_tokens = 64;
  o.tiering.window_tokens = 64;
  return o;
}

TEST(DecoderConfigTest, FullModeRunsTheFullPolicyLocallyOnTheCudaBackend) {
  const DecoderConfig c = *MakeDecoderConfig(Shape(), Options(KvMode::kFull, 0.03));
  EXPECT_EQ(c.sequence.policy, "full");
  EXPECT_EQ(c.runtime.backend, StoreBackend::kCuda);
  EXPECT_TRUE(c.runtime.daemon_address.empty());
  EXPECT_EQ(c.runtime.page_tokens, 16u);
  EXPECT_EQ(c.runtime.attention.num_q_heads, 8u);
  // No budget applies: the decoder's evict_ratio is not read.
  EXPECT_EQ(c.sequence.tiering.budgets.evict_ratio, 0.0);
  EXPECT_EQ(c.sequence.tiering.budgets.hbm_ratio, 1.0);
}

TEST(DecoderConfigTest, HierarchyModeCarriesTheBudgetsAndProtectedSpans) {
  DecoderOptions o = Options(KvMode::kHierarchy, 0.03);
  o.tiering.hbm_ratio = 0.25;
  o.tiering.sink_tokens = 8;
  o.tiering.retier_interval = 5;
  o.tiering.prompt_tokens = 5000;  // past the context: the whole chain is the prompt
  const DecoderConfig c = *MakeDecoderConfig(Shape(), o);
  EXPECT_EQ(c.sequence.policy, "hierarchy");
  const tiering::TieringConfig& t = c.sequence.tiering;
  EXPECT_EQ(t.budgets.hbm_ratio, 0.25);
  EXPECT_EQ(t.budgets.evict_ratio, 0.03);
  EXPECT_EQ(t.budgets.compress_ratio, 0.0);
  EXPECT_EQ(t.sink_tokens, 8u);
  EXPECT_EQ(t.window_tokens, 64u);
  EXPECT_EQ(t.retier_interval, 5u);
  EXPECT_TRUE(t.protect_prompt);
  EXPECT_EQ(t.page_tokens, 16u);
  EXPECT_EQ(c.sequence.prompt_tokens, 700u);
}

TEST(DecoderConfigTest, MemoryHoldsEveryPageOfEverySequence) {
  for (bool bf16 : {true, false}) {
    for (KvMode mode : {KvMode::kFull, KvMode::kHierarchy}) {
      DecoderOptions o = Options(mode, 0);
      o.page_tokens = 5;  // a page of 5 tokens: 3840 / 7680 bytes, not a multiple of 256
      o.bf16_kv = bf16;
      const DecoderConfig c = *MakeDecoderConfig(Shape(), o);
      EXPECT_EQ(c.runtime.kv_element_bytes, bf16 ? 2u : 4u);
      EXPECT_EQ(c.pages_per_sequence, (700u + 8 + 4) / 5);
      EXPECT_EQ(c.page_bytes, 2ull * 5 * 2 * 64 * (bf16 ? 2 : 4) * 3);
      const uint64_t aligned = (c.page_bytes + 255) / 256 * 256;
      EXPECT_EQ(c.runtime.arena_bytes, 3 * c.pages_per_sequence * aligned);
      if (mode == KvMode::kHierarchy) {
        EXPECT_EQ(c.runtime.local_ddr_bytes, 3 * c.pages_per_sequence * aligned);
      } else {  // full mode never offloads: a token pool, a small share of what T1 would need
        EXPECT_LT(c.runtime.local_ddr_bytes, 3 * c.pages_per_sequence * aligned / 10);
      }
    }
  }
}

TEST(DecoderConfigTest, BadInputNamesTheFieldAndTheValue) {
  auto message = [](const DecoderOptions& o, AttentionShape shape = Shape()) {
    absl::StatusOr<DecoderConfig> c = MakeDecoderConfig(shape, o);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    return std::string(c.status().message());
  };
  DecoderOptions o = Options(KvMode::kHierarchy, 0);
  o.batch = 0;
  EXPECT_NE(message(o).find("batch must be in [1, 1024], got 0"), std::string::npos);
  o.batch = 1025;
  EXPECT_NE(message(o).find("got 1025"), std::string::npos);
  o = Options(KvMode::kHierarchy, 0);
  o.context_tokens = 0;
  EXPECT_NE(message(o).find("context_tokens"), std::string::npos);
  o = Options(KvMode::kHierarchy, 0);
  o.max_new_tokens = 0;
  EXPECT_NE(message(o).find("max_new_tokens"), std::string::npos);
  o = Options(KvMode::kHierarchy, 0);
  o.page_tokens = 0;
  EXPECT_NE(message(o).find("page_tokens"), std::string::npos);
  o = Options(KvMode::kHierarchy, 0);
  o.tiering.hbm_ratio = 1.5;
  EXPECT_NE(message(o).find("tiering.hbm_ratio must be in [0, 1], got 1.5"), std::string::npos);
  o = Options(KvMode::kHierarchy, -0.1);
  EXPECT_NE(message(o).find("tiering.evict_ratio"), std::string::npos);
  o = Options(KvMode::kHierarchy, 0);
  o.tiering.retier_interval = 0;
  EXPECT_NE(message(o).find("tiering.retier_interval"), std::string::npos);
  AttentionShape bad = Shape();
  bad.head_dim = 0;
  EXPECT_NE(message(Options(KvMode::kFull, 0), bad).find("head_dim"), std::string::npos);
}

// What the decoder's first re-tiering (after step 0) does with these options: the policy the
// sequences run, on the placement they hold then (every page in T0) and arbitrary scores,
// moves a real share of the chain to T1, evicts only with r > 0, and keeps the protected pages
// (the prompt, the sinks, the window, the page being written) in T0.
TEST(DecoderConfigTest, TheFirstRetieringSplitsTheChainBetweenT0AndT1) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> score(0.f, 1.f);
  for (double evict : {0.0, 0.03}) {
    const DecoderConfig c = *MakeDecoderConfig(Shape(), Options(KvMode::kHierarchy, evict));
    absl::StatusOr<std::unique_ptr<tiering::Policy>> policy =
        tiering::MakePolicy(c.sequence.policy, c.sequence.tiering);
    ASSERT_TRUE(policy.ok()) << policy.status();
    const uint64_t length = 701;  // the chain and step 0's token
    const uint32_t pages = static_cast<uint32_t>((length + 15) / 16);
    tiering::Placement current{.num_groups = 1, .num_pages = pages};
    current.tiers.assign(pages, Tier::kT0);
    std::vector<float> scores(pages);
    for (float& s : scores) s = score(rng);
    absl::StatusOr<tiering::Placement> target =
        (*policy)->Decide({{c.sequence.prompt_tokens, length}, current, scores});
    ASSERT_TRUE(target.ok()) << target.status();
    const auto count = [&](Tier t) {
      return std::count(target->tiers.begin(), target->tiers.end(), t);
    };
    EXPECT_GT(count(Tier::kT1), 10) << "evict " << evict;
    EXPECT_EQ(count(Tier::kT2), 0);
    if (evict == 0) {
      EXPECT_EQ(count(Tier::kT3), 0);
    } else {
      EXPECT_GT(count(Tier::kT3), 0);
    }
    for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(target->at(0, p), Tier::kT0) << "prompt page " << p;
    for (uint32_t p = (length - 64) / 16; p < pages; ++p) {
      EXPECT_EQ(target->at(0, p), Tier::kT0) << "window page " << p;
    }
  }
}

}  // namespace
}  // namespace kvtier::worker::cuda
