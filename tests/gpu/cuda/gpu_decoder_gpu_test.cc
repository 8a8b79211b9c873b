// The GPU engine path end to end on a small synthetic model: `full` and `hierarchy` with no
// eviction give bit-identical logits, tokens and attention mass (the zero-error property on the
// GPU), and the prefetch moves exactly the T1 bytes the staging plan says.

#include <unistd.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/gpu_decoder.h"
#include "worker/cuda/shm_region.h"

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
  std::vector<float> mass;
  std::vector<uint64_t> h2d;
  DecoderStats stats;
};

class GpuDecoderGpuTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    const std::string why = ::kvtier::testing::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
    absl::StatusOr<std::unique_ptr<SyntheticModel>> m = SyntheticModel::Create(Small(GetParam()));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = *std::move(m);
  }

  DecodeRun Decode(const DecoderOptions& o, uint32_t steps) {
    DecodeRun run;
    const uint64_t pool_bytes = *GpuDecoder::RequiredPoolBytes(model_->config(), o);
    std::unique_ptr<ShmRegion> shm;
    std::unique_ptr<PinnedMapping> pool;
    if (pool_bytes > 0) {
      shm = *ShmRegion::Create(absl::StrCat("/kvtier-dec-", getpid(), "-", counter_++), pool_bytes);
      pool = *PinnedMapping::Create(shm->data(), shm->size(), {});
    }
    absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(*model_, o, pool.get());
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return run;
    for (uint32_t s = 0; s < steps; ++s) {
      EXPECT_TRUE((*d)->Step().ok());
      std::vector<float> logits;
      std::vector<int32_t> tokens;
      EXPECT_TRUE((*d)->ReadLogits(&logits).ok());
      EXPECT_TRUE((*d)->ReadTokens(&tokens).ok());
      run.logits.push_back(logits);
      run.tokens.push_back(tokens);
      run.h2d.push_back((*d)->stats().last_step_h2d_bytes);
    }
    EXPECT_TRUE((*d)->ReadMass(&run.mass).ok());
    run.stats = (*d)->stats();
    return run;
  }

  static DecoderOptions Options(KvMode mode, double evict) {
    DecoderOptions o;
    o.batch = 3;
    o.context_tokens = 700;
    o.max_new_tokens = 8;
    o.page_tokens = 16;
    o.mode = mode;
    o.split.evict_ratio = evict;
    o.split.prompt_tokens = 64;
    o.split.window_tokens = 64;
    return o;
  }

  std::unique_ptr<SyntheticModel> model_;
  int counter_ = 0;
};

TEST_P(GpuDecoderGpuTest, HierarchyWithoutEvictionIsBitIdenticalToFull) {
  const DecodeRun full = Decode(Options(KvMode::kFull, 0), 4);
  const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0), 4);
  ASSERT_EQ(full.logits.size(), 4u);
  ASSERT_EQ(tiered.logits.size(), 4u);
  EXPECT_GT(tiered.stats.t1_pages_per_seq, 10u);  // a real split, not all-T0
  for (int s = 0; s < 4; ++s) {
    ASSERT_EQ(
        0, std::memcmp(full.logits[s].data(), tiered.logits[s].data(), full.logits[s].size() * 4))
        << "step " << s;
    EXPECT_EQ(full.tokens[s], tiered.tokens[s]);
    for (float x : full.logits[s]) ASSERT_TRUE(std::isfinite(x));
  }
  ASSERT_EQ(0, std::memcmp(full.mass.data(), tiered.mass.data(), full.mass.size() * 4));
  EXPECT_EQ(full.h2d[0], 0u);
}

TEST_P(GpuDecoderGpuTest, TwoSlotsRecopyTheT1BytesOfTheLayersThatShareASlot) {
  const DecodeRun tiered = Decode(Options(KvMode::kHierarchy, 0.03), 3);
  ASSERT_EQ(tiered.h2d.size(), 3u);
  const uint64_t block = 2ull * 16 * 2 * GetParam() * 2;
  const uint64_t per_layer = 3ull /*batch*/ * tiered.stats.t1_pages_per_seq * block;
  // Three layers on two slots (slot = layer % 2): layers 0 and 2 share slot 0, so each step
  // re-copies both; layer 1 keeps slot 1 to itself and its unchanged pages are not copied again
  // (differential staging). The first step copies all three layers.
  EXPECT_EQ(tiered.h2d[0], 3 * per_layer);
  EXPECT_EQ(tiered.h2d[1], 2 * per_layer);
  EXPECT_EQ(tiered.h2d[2], 2 * per_layer);
  EXPECT_GT(tiered.stats.evicted_pages_per_seq, 0u);
  // Evicted positions get no attention.
  const uint32_t stride = 708;
  uint32_t zero = 0;
  for (uint32_t p = 0; p < 700; ++p) zero += tiered.mass[p] == 0.f;
  EXPECT_GE(zero, tiered.stats.evicted_pages_per_seq * 16u);
  for (uint32_t p = 0; p < stride; ++p) ASSERT_TRUE(std::isfinite(tiered.mass[p]));
}

TEST_P(GpuDecoderGpuTest, OneSlotPerLayerStagesOnce) {
  DecoderOptions o = Options(KvMode::kHierarchy, 0);
  o.staging_slots = 3;  // = layers: differential staging keeps every layer's pages
  const DecodeRun tiered = Decode(o, 3);
  const DecodeRun full = Decode(Options(KvMode::kFull, 0), 3);
  EXPECT_GT(tiered.h2d[0], 0u);
  EXPECT_EQ(tiered.h2d[1], 0u);
  EXPECT_EQ(tiered.h2d[2], 0u);
  ASSERT_EQ(0,
            std::memcmp(full.logits[2].data(), tiered.logits[2].data(), full.logits[2].size() * 4));
}

// A page that fills during decoding is written back to the pool on the D2H stream: after
// context 700 (page 43 holds 688..703), step 3 writes position 703 and completes page 43.
TEST_P(GpuDecoderGpuTest, FilledPagesAreWrittenBackToThePool) {
  const DecoderOptions o = Options(KvMode::kHierarchy, 0.03);
  const uint64_t pool_bytes = *GpuDecoder::RequiredPoolBytes(model_->config(), o);
  std::unique_ptr<ShmRegion> shm =
      *ShmRegion::Create(absl::StrCat("/kvtier-dec-wb-", getpid()), pool_bytes);
  std::unique_ptr<PinnedMapping> pool = *PinnedMapping::Create(shm->data(), shm->size(), {});
  std::unique_ptr<GpuDecoder> d = *GpuDecoder::Create(*model_, o, pool.get());
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(d->Step().ok());
  EXPECT_EQ(d->stats().write_back_d2h_bytes, 0u);
  ASSERT_TRUE(d->Step().ok());
  EXPECT_EQ(d->stats().write_back_d2h_bytes, 3ull * 3 * d->BlockBytes());
  ASSERT_TRUE(d->Sync().ok());
  for (uint32_t b = 0; b < 3; ++b) {
    for (uint32_t l = 0; l < 3; ++l) {
      std::vector<uint8_t> block;
      ASSERT_TRUE(d->ReadT0Block(b, 43, l, &block).ok());
      EXPECT_EQ(0,
                std::memcmp(shm->data() + d->WriteBackOffset(l, b, 43), block.data(), block.size()))
          << "sequence " << b << " layer " << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuDecoderGpuTest, ::testing::Values(64u, 128u));

}  // namespace
}  // namespace kvtier::worker::cuda
