// The synthetic decoder on the GPU, its KV cache in the tiered store over the CUDA backend:
// `full` and `hierarchy` with no eviction give bit-identical logits, tokens and cumulative
// scores (the zero-error property on the GPU) while hierarchy really reads T1 pages staged from
// host memory; the staging moves exactly the T1 bytes the double-buffered slots call for; pages
// leave T0 by the policy's plans.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/cuda_kv_backend.h"
#include "worker/cuda/gpu_decoder.h"

namespace kvtier::worker::cuda {
namespace {

SyntheticModelConfig Small(uint32_t head_dim) {
  SyntheticModelConfig c;
  c.num_layers = 3;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.hidden = 256;
  c.ffn = 512;
  c.vocab = 1000;
  return c;
}

struct DecodeRun {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<uint64_t> h2d;                    // staging bytes per step
  std::vector<uint64_t> descriptors;            // staging copy descriptors per step
  std::vector<uint64_t> calls;                  // staging copy calls per step
  std::vector<std::vector<uint64_t>> t1_slots;  // [sequence] T1 slot offsets, at the end
  std::vector<std::vector<float>> scores;       // [sequence] cumulative, as of the last re-tiering
  DecoderStats stats;
};

// (head_dim, bf16 KV)
class GpuDecoderGpuTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {
 protected:
  void SetUp() override {
    const std::string why = ::kvtier::testing::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
    absl::StatusOr<std::unique_ptr<SyntheticModel>> m = SyntheticModel::Create(Small(HeadDim()));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = *std::move(m);
  }

  DecodeRun Decode(const DecoderOptions& o, uint32_t steps) {
    DecodeRun run;
    absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(*model_, o);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return run;
    for (uint32_t s = 0; s < steps; ++s) {
      absl::Status step = (*d)->Step();
      EXPECT_TRUE(step.ok()) << step;
      std::vector<float> logits;
      std::vector<int32_t> tokens;
      EXPECT_TRUE((*d)->ReadLogits(&logits).ok());
      EXPECT_TRUE((*d)->ReadTokens(&tokens).ok());
      run.logits.push_back(logits);
      run.tokens.push_back(tokens);
      run.h2d.push_back((*d)->stats().last_step_h2d_bytes);
      run.descriptors.push_back((*d)->stats().last_step_copy_descriptors);
      run.calls.push_back((*d)->stats().last_step_copy_calls);
    }
    for (uint32_t b = 0; b < o.batch; ++b) {
      absl::Span<const float> s = (*d)->sequence(b).scores().TokenScores(0);
      run.scores.emplace_back(s.begin(), s.end());
      run.t1_slots.emplace_back();
      for (const ReleasedSlot& slot : (*d)->sequence(b).store().HeldSlots()) {
        if (slot.kind == PoolKind::kDdr) run.t1_slots.back().push_back(slot.offset);
      }
    }
    run.stats = (*d)->stats();
    return run;
  }

  static uint32_t HeadDim() { return std::get<0>(GetParam()); }
  static bool Bf16() { return std::get<1>(GetParam()); }

  static DecoderOptions Options(KvMode mode, double evict, uint32_t retier_interval) {
    DecoderOptions o;
    o.bf16_kv = Bf16();
    o.batch = 3;
    o.context_tokens = 700;
    o.max_new_tokens = 8;
    o.page_tokens = 16;
    o.mode = mode;
    o.tiering.evict_ratio = evict;
    o.tiering.prompt_tokens = 64;
    o.tiering.window_tokens = 64;
    o.tiering.retier_interval = retier_interval;
    return o;
  }

  // One layer's block (K and V) of one page.
  static uint64_t BlockBytes() { return 2ull * 16 * 2 * HeadDim() * (Bf16() ? 2 : 4); }

  std::unique_ptr<SyntheticModel> model_;
};

// Re-tiering after step 0 only (64), and after every step (1: pages move between T0 and T1
// while the scores change, and attention still reads the same bytes).
TEST_P(GpuDecoderGpuTest, HierarchyWithoutEvictionIsBitIdenticalToFull) {
  for (uint32_t retier : {64u, 1u}) {
    SCOPED_TRACE(absl::StrCat("retier_interval ", retier));
    const DecodeRun full = Decode(Options(KvMode::kFull, 0, retier), 4);
    const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0, retier), 4);
    ASSERT_EQ(full.logits.size(), 4u);
    ASSERT_EQ(tiered.logits.size(), 4u);
    // A real split, read from T1: every page starts in T0, the first re-tiering (after step 0)
    // offloads by plan, and later steps stage T1 pages for attention.
    EXPECT_GT(tiered.stats.t1_pages, 3u * 10);
    EXPECT_EQ(tiered.stats.evicted_pages, 0u);
    EXPECT_GT(tiered.stats.offload_d2h_bytes, 0u);
    EXPECT_EQ(tiered.h2d[0], 0u);
    for (int s = 1; s < 4; ++s) EXPECT_GT(tiered.h2d[s], 0u) << "step " << s;
    EXPECT_EQ(full.stats.t1_pages, 0u);
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(full.h2d[s], 0u);
      ASSERT_EQ(
          0, std::memcmp(full.logits[s].data(), tiered.logits[s].data(), full.logits[s].size() * 4))
          << "step " << s;
      EXPECT_EQ(full.tokens[s], tiered.tokens[s]);
      for (float x : full.logits[s]) ASSERT_TRUE(std::isfinite(x));
    }
    // The device-accumulated cumulative scores match bit for bit too, and are not all zero.
    for (uint32_t b = 0; b < 3; ++b) {
      ASSERT_EQ(full.scores[b].size(), tiered.scores[b].size());
      ASSERT_FALSE(full.scores[b].empty());
      EXPECT_EQ(
          0, std::memcmp(full.scores[b].data(), tiered.scores[b].data(), full.scores[b].size() * 4))
          << "sequence " << b;
      double sum = 0;
      for (float x : full.scores[b]) sum += x;
      EXPECT_GT(sum, 0.0) << "sequence " << b;
    }
  }
}

TEST_P(GpuDecoderGpuTest, TwoSlotsRecopyTheT1BytesOfTheLayersThatShareASlot) {
  const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0.03, 64), 4);
  ASSERT_EQ(tiered.h2d.size(), 4u);
  // The placement of steps 1..3 is the one re-tiering after step 0 made (the next is at 64).
  const uint64_t per_layer = tiered.stats.t1_pages * BlockBytes();
  ASSERT_GT(per_layer, 0u);
  // Three layers on the backend's two slots (slot = layer % 2): layers 0 and 2 share slot 0,
  // so each step re-copies both; layer 1 keeps slot 1 and its unchanged pages are not copied
  // again (differential staging). After layer 2, layer 0 of the next step is prefetched (the
  // wrap), so a step's layer 0 finds its pages staged. Step 0 stages nothing (all T0); step 1
  // copies layers 0, 1 and 2, and layer 0 again for step 2.
  EXPECT_EQ(tiered.h2d[0], 0u);
  EXPECT_EQ(tiered.h2d[1], 4 * per_layer);
  EXPECT_EQ(tiered.h2d[2], 2 * per_layer);
  EXPECT_EQ(tiered.h2d[3], 2 * per_layer);
  EXPECT_GT(tiered.stats.evicted_pages, 0u);
  for (const auto& logits : tiered.logits) {
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

// Runs of T1 pages whose slots are evenly spaced in the pool, in slot order (what one strided
// copy per run moves): the descriptors a staged layer of this sequence needs.
uint64_t StridedRunsOfSlots(std::vector<uint64_t> slots) {
  std::sort(slots.begin(), slots.end());
  uint64_t runs = 0;
  for (size_t i = 0; i < slots.size();) {
    size_t j = i + 1;
    if (j < slots.size()) {
      const uint64_t pitch = slots[j] - slots[i];
      while (j + 1 < slots.size() && slots[j + 1] - slots[j] == pitch) ++j;
      ++j;
    }
    ++runs;
    i = j;
  }
  return runs;
}

// Staging issues one descriptor per run of evenly spaced T1 slots and staged layer, not one per
// page and layer (the count follows from the slots the plans gave each sequence), and the
// attention reading the staged blocks stays bit-identical to full (the test above).
TEST_P(GpuDecoderGpuTest, StagingIssuesOneDescriptorPerEvenlySpacedRunOfSlots) {
  const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0.03, 64), 4);
  ASSERT_EQ(tiered.h2d.size(), 4u);
  const uint64_t per_layer = tiered.stats.t1_pages * BlockBytes();
  ASSERT_GT(per_layer, 0u);
  uint64_t runs = 0;
  for (const std::vector<uint64_t>& slots : tiered.t1_slots) runs += StridedRunsOfSlots(slots);
  EXPECT_LT(runs, tiered.stats.t1_pages);  // a real merge, not one page per descriptor
  for (int s = 1; s < 4; ++s) {
    ASSERT_EQ(tiered.h2d[s] % per_layer, 0u) << "step " << s;
    const uint64_t layers = tiered.h2d[s] / per_layer;  // staged layers, every sequence's
    EXPECT_GT(layers, 0u);
    EXPECT_EQ(tiered.descriptors[s], layers * runs) << "step " << s;
    EXPECT_LE(tiered.calls[s], tiered.descriptors[s]) << "step " << s;
  }
}

// The stores' working memory is inside the HBM budget the decoder sized: the arena holds the
// T0 pages and every store's staging slots and T2 scratch, within T0 + batch ×
// StoreWorkingBytes (the decoder's local runtime always has a T2 pool).
TEST_P(GpuDecoderGpuTest, WorkingMemoryIsInsideTheHbmBudget) {
  DecoderOptions o = Options(KvMode::kHierarchy, 0.03, 64);
  absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(*model_, o);
  ASSERT_TRUE(d.ok()) << d.status();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*d)->Step().ok());
  ASSERT_TRUE((*d)->Sync().ok());
  const DecoderStats st = (*d)->stats();
  const DecoderConfig& c = (*d)->config();
  const uint64_t t0 = st.t0_pages * c.page_bytes;
  ASSERT_GT(st.t1_pages, 0u);
  absl::StatusOr<const codecs::Codec*> codec = codecs::FindCodec(c.runtime.codec);
  ASSERT_TRUE(codec.ok()) << codec.status();
  // Every sequence stages: two slots of at least 64 entries each, and the T2 scratch.
  EXPECT_GE(st.arena_bytes, t0 + 3 * 2 * 64 * BlockBytes());
  const StoreWorkingShape shape{.geometry = c.geometry,
                                .num_q_heads = model_->config().num_q_heads,
                                .max_tokens = 700 + 8,
                                .staged_pages = c.pages_per_sequence,
                                .batch = 3,
                                .t2_codec = *codec};
  EXPECT_LE(st.arena_bytes, t0 + 3 * StoreWorkingBytes(shape));
}

// Pages leave T0 only by the policy's plans: one plan per sequence (after step 0), whose
// offloads wrote exactly the T1 pages' bytes, and every page of the chain is in one tier.
TEST_P(GpuDecoderGpuTest, PagesLeaveT0ByThePolicysPlans) {
  const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0.03, 64), 4);
  const uint64_t page_bytes = 3 * BlockBytes();
  EXPECT_EQ(tiered.stats.plans, 3u);
  EXPECT_EQ(tiered.stats.offload_d2h_bytes, tiered.stats.t1_pages * page_bytes);
  EXPECT_EQ(tiered.stats.promote_h2d_bytes, 0u);
  EXPECT_EQ(tiered.stats.t0_pages + tiered.stats.t1_pages + tiered.stats.evicted_pages,
            3u * ((700 + 4 + 15) / 16));
  EXPECT_EQ(tiered.stats.t1_pool_bytes, tiered.stats.t1_pages * page_bytes);
}

INSTANTIATE_TEST_SUITE_P(HeadDimsAndKvTypes, GpuDecoderGpuTest,
                         ::testing::Combine(::testing::Values(64u, 128u), ::testing::Bool()));

}  // namespace
}  // namespace kvtier::worker::cuda
