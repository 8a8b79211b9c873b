#include "core/planning/capacity.h"

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/planning/models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/codecs/codec.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::planning {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Page 16, sinks 4, window 128, prompt protected: DESIGN.md §2's defaults.
PlanInput Input(const char* model, uint32_t gpus, uint32_t batch, uint64_t context, uint64_t prompt,
                double beta, double r, double gamma) {
  PlanInput in;
  in.model = *FindBuiltinModel(model);
  in.gpus = gpus;
  in.batch = batch;
  in.context_tokens = context;
  in.prompt_tokens = prompt;
  in.tiering.budgets = {.evict_ratio = r, .hbm_ratio = beta, .compress_ratio = gamma};
  return in;
}

TEST(CapacityTest, Llama3With8BMatchesTheHandComputation) {
  // Llama 3 8B: 32 layers, 8 KV heads (32 query heads), head_dim 128, bf16.
  //   KV/token = 2 × 32 × 8 × 128 × 2 = 131072 B (128 KiB); counting query heads: 524288 (4×).
  // 1 GPU, batch 8, context 32768, prompt 1024, β = 0.5, r = γ = 0:
  //   2048 pages; protected: prompt pages 0..63 (64), sinks [1024, 1028) page 64, window
  //   [32640, 32768) pages 2040..2047 (8): 73 pages, 1168 tokens; candidates 1975.
  //   T0 budget ceil(0.5 × 32768) = 16384; room (16384 − 1168) / 16 = 951 pages; T1 = 1024.
  //   T0 = 1168 + 951 × 16 = 16384 tokens (2 GiB), T1 = 16384 tokens (2 GiB) per sequence.
  //   Batch 8: full 32 GiB, T0 16 GiB, saved 16 GiB; DDR (T1) 16 GiB per host.
  auto plan = ComputePlan(Input("llama3-8b", 1, 8, 32768, 1024, 0.5, 0, 0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_bytes_per_token, 131072u);
  EXPECT_EQ(plan->mha_bytes_per_token, 4 * 131072u);
  EXPECT_EQ(plan->tiers.protected_tokens, 1168u);
  EXPECT_EQ(plan->tiers.t0_tokens, 16384u);
  EXPECT_EQ(plan->tiers.t1_tokens, 16384u);
  EXPECT_EQ(plan->tiers.t2_tokens + plan->tiers.t3_tokens, 0u);
  EXPECT_EQ(plan->seq_full_bytes, 4ull << 30);
  EXPECT_EQ(plan->seq_t0_bytes, 2ull << 30);
  EXPECT_EQ(plan->seq_t1_bytes, 2ull << 30);
  EXPECT_EQ(plan->gpu_full_bytes, 32ull << 30);
  EXPECT_EQ(plan->gpu_saved_bytes, 16ull << 30);
  EXPECT_EQ(plan->host_t1_bytes, 16ull << 30);
  EXPECT_EQ(plan->host_t2_bytes, 0u);
  // Parameters: 32 × (2 × 4096² + 2 × 4096 × 1024 + 3 × 4096 × 14336) + 2 × 128256 × 4096
  //   = 8,029,995,008; Meta's 8,030,261,248 adds the norms' 266,240.
  EXPECT_DOUBLE_EQ(plan->gpu_weight_bytes, 2 * 8029995008.0);
  // Nothing compressed or evicted: restaging all reads what all-in-HBM reads, and the schedule
  // splits those reads between the GPU and the CPU without losing any.
  const double hbm = 4.8e12, full = (2 * 8029995008.0 + (32ull << 30)) / hbm;
  EXPECT_NEAR(plan->full_step_seconds, full, 1e-12);
  EXPECT_NEAR(plan->step.stage_all_gpu_seconds, full, 1e-12);
  EXPECT_NEAR(plan->step.schedule_gpu_seconds + plan->step.in_place_share * (16ull << 30) / hbm,
              full, 1e-9);
  EXPECT_GE(plan->step.schedule_seconds, full);
}

TEST(CapacityTest, NoPlanReadsLessThanAllInHbmUnlessPagesAreCompressedOrEvicted) {
  // A randomized sweep with r = γ = 0: every host-side page is full precision, so whatever a
  // step does with them, the GPU's reads plus the CPU's equal all-in-HBM's reads, and neither
  // prediction undercuts it.
  std::mt19937 rng(20261206);
  const char* models[] = {"llama3-8b", "qwen2.5-7b", "mistral-7b", "llama3-70b"};
  for (int i = 0; i < 200; ++i) {
    const char* model = models[rng() % 4];
    const uint32_t gpus = std::string(model) == "llama3-70b" ? 8 : 1u << (rng() % 2);
    const uint64_t context = 4096u << (rng() % 4);
    const double beta = 0.1 + 0.8 * std::uniform_real_distribution<double>()(rng);
    auto plan = ComputePlan(Input(model, gpus, 1 + rng() % 16, context, 512, beta, 0, 0));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const double hbm = 4.8e12;
    const double host_bytes = static_cast<double>(plan->host_t1_bytes) / gpus;
    SCOPED_TRACE(absl::StrCat(model, " gpus ", gpus, " context ", context, " beta ", beta));
    EXPECT_NEAR(plan->step.stage_all_gpu_seconds, plan->full_step_seconds, 1e-9);
    EXPECT_NEAR(plan->step.schedule_gpu_seconds + plan->step.in_place_share * host_bytes / hbm,
                plan->full_step_seconds, 1e-9);
    EXPECT_GE(plan->step.stage_all_seconds, plan->full_step_seconds - 1e-12);
    EXPECT_GE(plan->step.schedule_seconds, plan->step.schedule_gpu_seconds);
    EXPECT_LE(plan->step.schedule_seconds, plan->step.stage_all_seconds + 1e-12);
  }
}

TEST(CapacityTest, Qwen7BMatchesTheHandComputationAndIsSevenTimesUnderAnMhaEstimate) {
  // DeepSeek-R1-Distill-Qwen-7B (Qwen2.5 7B geometry): 28 layers, 4 KV heads (28 query heads).
  //   KV/token = 2 × 28 × 4 × 128 × 2 = 57344 B; the MHA count 401408 B is 7× that.
  // 1 GPU, batch 4, context 16384, prompt 512, β = 0.25, r = 0.1, γ = 0.2:
  //   1024 pages; protected: pages 0..31, 32 (sinks), 1016..1023: 41 pages, 656 tokens;
  //   candidates 983. T3 = floor(floor(0.1 × 983 × 16) / 16) = floor(1572 / 16) = 98 pages.
  //   Survivors 885; T2 = floor(0.2 × 885) = 177. Live = 16384 − 1568 = 14816 tokens;
  //   T0 budget ceil(0.25 × 14816) = 3704; room floor((3704 − 656) / 16) = 190 pages;
  //   T1 = 885 − 177 − 190 = 518. Tokens: T0 656 + 3040 = 3696, T1 8288, T2 2832, T3 1568.
  //   T1 page 16 × 57344 = 917504 B; T2 page per layer: K 512 × 8 + 16 × 512 = 12288,
  //   V 16 × 8 + 8192 = 8320 (both 16-aligned) → 20608 × 28 = 577024 B.
  //   Per sequence: T0 3696 × 57344 = 211,943,424; T1 518 × 917504 = 475,267,072;
  //   T2 177 × 577024 = 102,133,248. Batch 4: T0 847,773,696 of 3,758,096,384.
  auto plan = ComputePlan(Input("deepseek-r1-distill-qwen-7b", 1, 4, 16384, 512, 0.25, 0.1, 0.2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_bytes_per_token, 57344u);
  EXPECT_EQ(plan->mha_bytes_per_token, 7 * 57344u);
  EXPECT_EQ(plan->tiers.t0_tokens, 3696u);
  EXPECT_EQ(plan->tiers.t1_tokens, 8288u);
  EXPECT_EQ(plan->tiers.t2_tokens, 2832u);
  EXPECT_EQ(plan->tiers.t3_tokens, 1568u);
  EXPECT_EQ(plan->t2_page_bytes, 577024u);
  EXPECT_EQ(plan->seq_t0_bytes, 211943424u);
  EXPECT_EQ(plan->seq_t1_bytes, 475267072u);
  EXPECT_EQ(plan->seq_t2_bytes, 102133248u);
  EXPECT_EQ(plan->gpu_full_bytes, 3758096384u);
  EXPECT_EQ(plan->gpu_t0_bytes, 847773696u);
  EXPECT_EQ(plan->host_t1_bytes, 4 * 475267072u);
  EXPECT_EQ(plan->host_t2_bytes, 4 * 102133248u);
  // Step (docs/scheduling.md's model, 1 GPU: its own link and socket). Weights: 28 × (2 × 3584²
  // + 2 × 3584 × 512 + 3 × 3584 × 18944) + 2 × 152064 × 3584 = 7,615,283,200 parameters (Qwen's
  // 7.61B) × 2 = 15,230,566,400 B. Weights + T0 = 16,078,340,096 B: 3.3497 ms at 4.8 TB/s.
  // Stage all: T1 + T2 = 2,309,601,280 B a step over 55 GB/s = 41.99 ms (the GPU's reads of all
  // of it, 3.83 ms, hide under that). Schedule: it all fits the 8 GiB staging area, so only the
  // turnover crosses (10% per 64 steps: 3,608,752 B) and the step is the GPU reading weights, T0
  // and the resident pages: 18,387,941,376 B, 3.8308 ms. All in HBM reads weights + 4 × 16384 ×
  // 57344 B: 3.9563 ms; the schedule's step is shorter only by what T2 and T3 leave unread.
  EXPECT_DOUBLE_EQ(plan->gpu_weight_bytes, 15230566400.0);
  EXPECT_NEAR(plan->step.compute_seconds, 16078340096.0 / 4.8e12, 1e-12);
  EXPECT_DOUBLE_EQ(plan->step.stage_all_pcie_bytes, 2309601280.0);
  EXPECT_NEAR(plan->step.stage_all_gpu_seconds, 18387941376.0 / 4.8e12, 1e-12);
  EXPECT_NEAR(plan->step.stage_all_seconds, 2309601280.0 / 55e9, 1e-9);
  EXPECT_NEAR(plan->step.schedule_pcie_bytes, 2309601280.0 * 0.1 / 64, 1);
  EXPECT_NEAR(plan->step.schedule_gpu_seconds, 18387941376.0 / 4.8e12, 1e-12);
  EXPECT_NEAR(plan->step.schedule_seconds, 18387941376.0 / 4.8e12, 1e-12);
  EXPECT_NEAR(plan->full_step_seconds, (15230566400.0 + 4 * 16384 * 57344.0) / 4.8e12, 1e-12);
  EXPECT_EQ(plan->step.in_place_share, 0);
}

TEST(CapacityTest, Llama3With70BTensorParallelMatchesTheHandComputation) {
  // Llama 3 70B: 80 layers, 8 KV heads (64 query heads): KV/token 2 × 80 × 8 × 128 × 2 =
  //   327680 B, MHA count 8×. TP8 over 8 GPUs: one KV head per GPU, 40960 B/token per GPU.
  // Batch 16, context 32768, prompt 2048, β = 0.5, r = 0.05, γ = 0.3:
  //   2048 pages; protected: 0..127, 128 (sinks), 2040..2047: 137 pages, 2192 tokens;
  //   candidates 1911. T3 = floor(floor(0.05 × 1911 × 16) / 16) = floor(1528 / 16) = 95 pages.
  //   Survivors 1816; T2 = floor(0.3 × 1816) = 544. Live = 32768 − 1520 = 31248;
  //   T0 budget 15624; room floor((15624 − 2192) / 16) = 839; T1 = 1816 − 544 − 839 = 433.
  //   Tokens: T0 2192 + 13424 = 15616, T1 6928, T2 8704, T3 1520.
  //   Per GPU: T1 page 655360 B; T2 page (K 128 × 8 + 2048 = 3072, V 128 + 2048 = 2176) × 80 =
  //   419840 B. Per sequence: T0 639,631,360; T1 283,770,880; T2 228,392,960.
  //   Batch 16 per GPU: full 20 GiB, T0 10,234,101,760. Host (8 GPUs × 16): DDR T1
  //   36,322,672,640 B, T2 29,234,298,880 B.
  auto plan = ComputePlan(Input("llama3-70b", 8, 16, 32768, 2048, 0.5, 0.05, 0.3));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_bytes_per_token, 327680u);
  EXPECT_EQ(plan->mha_bytes_per_token, 8 * 327680u);
  EXPECT_EQ(plan->kv_heads_per_gpu, 1u);
  EXPECT_EQ(plan->replicas, 1u);
  EXPECT_EQ(plan->tiers.t0_tokens, 15616u);
  EXPECT_EQ(plan->tiers.t1_tokens, 6928u);
  EXPECT_EQ(plan->tiers.t2_tokens, 8704u);
  EXPECT_EQ(plan->tiers.t3_tokens, 1520u);
  EXPECT_EQ(plan->t1_page_bytes, 655360u);
  EXPECT_EQ(plan->t2_page_bytes, 419840u);
  EXPECT_EQ(plan->seq_t0_bytes, 639631360u);
  EXPECT_EQ(plan->seq_t1_bytes, 283770880u);
  EXPECT_EQ(plan->seq_t2_bytes, 228392960u);
  EXPECT_EQ(plan->gpu_full_bytes, 20ull << 30);
  EXPECT_EQ(plan->gpu_t0_bytes, 10234101760u);
  EXPECT_EQ(plan->host_t1_bytes, 36322672640u);
  EXPECT_EQ(plan->host_t2_bytes, 29234298880u);
  // 70,552,387,584 parameters (Meta publishes 70.6B) in bf16, an eighth per GPU.
  EXPECT_DOUBLE_EQ(plan->gpu_weight_bytes, 2 * 70552387584.0 / 8);
  // The schedule never predicts a slower step than restaging everything.
  EXPECT_LE(plan->step.schedule_seconds, plan->step.stage_all_seconds);
}

TEST(CapacityTest, T2PageBytesAreTheWorkersCompressedSlot) {
  const worker::codecs::Codec& codec = worker::codecs::Int8KiviCodec();
  for (uint32_t heads : {1u, 3u, 4u, 8u}) {
    for (uint32_t page : {1u, 16u, 33u}) {
      const layout::KvGeometry g{.num_layers = 7,
                                 .num_kv_heads = heads,
                                 .head_dim = 64,
                                 .element_bytes = 2,
                                 .page_tokens = page};
      EXPECT_EQ(Int8KiviPageBytes(7, g.ValuesPerTokenLayer(), page),
                worker::CompressedSlotBytes(codec, g, 0))
          << heads << " heads, " << page << " tokens";
    }
  }
}

TEST(CapacityTest, TensorParallelBeyondTheKvHeadsReplicatesThem) {
  PlanInput in = Input("qwen2.5-7b", 8, 1, 4096, 0, 1, 0, 0);  // 4 KV heads over 8 GPUs
  auto plan = ComputePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_heads_per_gpu, 1u);
  EXPECT_EQ(plan->gpu_full_bytes, 4096u * 2 * 28 * 128 * 2);
  EXPECT_EQ(plan->gpu_saved_bytes, 0u);  // β = 1: everything stays in HBM
}

TEST(CapacityTest, EveryBuiltinModelPlans) {
  for (const std::string& name : BuiltinModelNames()) {
    auto plan = ComputePlan(Input(name.c_str(), 8, 8, 32768, 0, 0.5, 0, 0));
    EXPECT_TRUE(plan.ok()) << name << ": " << plan.status();
  }
  EXPECT_FALSE(FindBuiltinModel("llama-9000").has_value());
  EXPECT_TRUE(FindBuiltinModel("Llama3-8B").has_value());
}

// Bad input: INVALID_ARGUMENT naming the field, the value and the limit.
void ExpectRejected(const PlanInput& in, const std::string& field, const std::string& value,
                    const std::string& limit) {
  auto plan = ComputePlan(in);
  ASSERT_FALSE(plan.ok()) << field;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr(field), HasSubstr(value), HasSubstr(limit)));
}

TEST(CapacityTest, RejectsOutOfRangeInputNamingFieldValueAndLimit) {
  const PlanInput ok = Input("llama3-8b", 8, 8, 32768, 0, 0.5, 0, 0);
  PlanInput in = ok;
  in.context_tokens = 0;
  ExpectRejected(in, "context", "got 0", "[1, 16777216]");
  in = ok;
  in.gpus = 65;
  ExpectRejected(in, "gpus", "got 65", "64");
  in = ok;
  in.tensor_parallel = 3;
  ExpectRejected(in, "tensor_parallel", "(3)", "gpus (8)");
  in = ok;
  in.gpus = 3;
  in.tensor_parallel = 3;
  in.host.gpus_per_link = 1;
  in.host.sockets = 1;
  ExpectRejected(in, "tensor_parallel", "(3)", "num_kv_heads (8)");
  in = ok;
  in.batch = 0;
  ExpectRejected(in, "batch", "got 0", "[1, 65536]");
  in = ok;
  in.prompt_tokens = 40000;
  ExpectRejected(in, "prompt_tokens", "got 40000", "32768");
  in = ok;
  in.element_bytes = 3;
  ExpectRejected(in, "element_bytes", "got 3", "1, 2 or 4");
  in = ok;
  in.tiering.budgets.hbm_ratio = 1.5;
  ExpectRejected(in, "hbm_ratio", "1.5", "[0, 1]");
  in = ok;
  in.tiering.budgets.evict_ratio = 0.6;
  in.tiering.budgets.compress_ratio = 0.6;
  ExpectRejected(in, "evict_ratio + budgets.compress_ratio", "0.6 + 0.6", "exceed 1");
  in = ok;
  in.host.link_bytes_per_second = -1;
  ExpectRejected(in, "link_bytes_per_second", "got -1", "(0, ");
  in = ok;
  in.gpus = 6;
  in.tensor_parallel = 2;
  ExpectRejected(in, "gpus_per_link", "(4)", "gpus (6)");
  in = ok;
  in.model.num_kv_heads = 0;
  ExpectRejected(in, "num_kv_heads", "got 0", "[1, 4096]");
  in = ok;
  in.model.num_heads = 4;  // fewer query heads than KV heads
  ExpectRejected(in, "num_heads", "got 4", "[8, 4096]");
  in = ok;
  in.tiering.page_tokens = 1;
  in.context_tokens = 1 << 24;
  in.model.weight_bytes = std::nan("");
  ExpectRejected(in, "weight_bytes", "nan", "(0, ");
}

}  // namespace
}  // namespace kvtier::planning
