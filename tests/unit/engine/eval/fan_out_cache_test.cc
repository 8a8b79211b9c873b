#include "engine/eval/fan_out_cache.h"

#include <random>

#include "engine/eval/eval_sequence.h"
#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

constexpr worker::AttentionShape kShape{
    .num_layers = 3, .num_q_heads = 6, .num_kv_heads = 2, .head_dim = 8, .scale = 0.35f};
constexpr uint32_t kKvd = kShape.num_kv_heads * kShape.head_dim;
constexpr uint32_t kQd = kShape.num_q_heads * kShape.head_dim;

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<EvalConfig> Configs() {
  return {{.policy = "full"},
          {.policy = "hierarchy", .hbm_ratio = 0.3, .evict_ratio = 0.3},
          {.policy = "hierarchy", .hbm_ratio = 0.3, .compress_ratio = 0.5, .codec = "int8_kivi"},
          {.policy = "h2o", .hbm_ratio = 0.3},
          {.policy = "rkv", .hbm_ratio = 0.3},
          {.policy = "snapkv", .hbm_ratio = 0.3},
          {.policy = "streaming", .hbm_ratio = 0.3},
          {.policy = "arkv", .evict_ratio = 0.5}};
}

EvalSequenceOptions Options() {
  EvalSequenceOptions o;
  o.page_tokens = 4;
  o.retier_interval = 4;
  o.window_tokens = 8;
  o.sink_tokens = 2;
  o.protect_prompt = false;
  return o;
}

struct Set {
  EvalContext ctx{kShape, Options()};
  std::vector<std::unique_ptr<EvalSequence>> seqs;
};

// A prefill whose attention the baselines and the hierarchy share (the default) leaves every
// configuration in the state its own prefill would: the same outputs, placements and costs
// over later decode steps with re-tiering, bit for bit, at random prompts.
TEST(FanOutCache, SharedPrefillEqualsEveryMemberAttendingForItself) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    const uint32_t prompt = 40 + 7 * trial, steps = 12;
    Set shared, verified;
    uint64_t shared_count = 0;
    for (Set* set : {&shared, &verified}) {
      std::vector<worker::AttentionCache*> caches;
      for (const EvalConfig& c : Configs()) {
        auto seq = set->ctx.Open(c, prompt);
        ASSERT_TRUE(seq.ok()) << seq.status();
        caches.push_back(&(*seq)->cache());
        set->seqs.push_back(std::move(*seq));
      }
      FanOutCache fan(caches, /*verify=*/set == &verified);
      fan.set_out_floats(size_t{prompt} * kQd);
      std::mt19937 same(100 + trial);  // both sets see the same prompt
      for (uint32_t l = 0; l < kShape.num_layers; ++l) {
        auto k = Random(same, prompt * kKvd), v = Random(same, prompt * kKvd);
        auto q = Random(same, prompt * kQd);
        ASSERT_TRUE(fan.Append(l, k.data(), v.data(), prompt).ok());
        std::vector<float> out(prompt * kQd);
        ASSERT_TRUE(fan.Attend(l, q.data(), prompt, out.data(), nullptr).ok());
      }
      for (auto& s : set->seqs) ASSERT_TRUE(s->AfterPrefill().ok());
      if (set == &shared) shared_count = fan.shared();
      if (set == &verified) {
        EXPECT_EQ(fan.shared(), 0u);
      }
    }
    // The five baselines' probes and the two hierarchy sequences.
    EXPECT_EQ(shared_count, 7u * kShape.num_layers);
    for (uint32_t step = 0; step < steps; ++step) {
      std::vector<std::vector<float>> kv;
      for (uint32_t l = 0; l < kShape.num_layers; ++l) {
        kv.push_back(Random(rng, kKvd));
        kv.push_back(Random(rng, kKvd));
        kv.push_back(Random(rng, kQd));
      }
      for (size_t i = 0; i < shared.seqs.size(); ++i) {
        for (uint32_t l = 0; l < kShape.num_layers; ++l) {
          std::vector<float> a(kQd), b(kQd);
          for (auto [set, out] : {std::pair{&shared, &a}, std::pair{&verified, &b}}) {
            worker::AttentionCache& c = set->seqs[i]->cache();
            ASSERT_TRUE(c.Append(l, kv[3 * l].data(), kv[3 * l + 1].data(), 1).ok());
            ASSERT_TRUE(c.Attend(l, kv[3 * l + 2].data(), 1, out->data(), nullptr).ok());
          }
          ASSERT_EQ(a, b) << "trial " << trial << " member " << i << " step " << step;
        }
        ASSERT_TRUE(shared.seqs[i]->AfterStep().ok());
        ASSERT_TRUE(verified.seqs[i]->AfterStep().ok());
      }
    }
    for (size_t i = 0; i < shared.seqs.size(); ++i) {
      const EvalCost a = shared.seqs[i]->Cost(), b = verified.seqs[i]->Cost();
      EXPECT_EQ(a.t0_now_bytes, b.t0_now_bytes) << "member " << i;
      EXPECT_EQ(a.evicted_fraction, b.evicted_fraction) << "member " << i;
      EXPECT_EQ(a.ddr_bytes, b.ddr_bytes) << "member " << i;
      EXPECT_EQ(a.compressed_bytes, b.compressed_bytes) << "member " << i;
    }
    // Something was placed: the comparison is not between two untouched caches.
    EXPECT_GT(shared.seqs[1]->Cost().evicted_fraction, 0) << "trial " << trial;
    EXPECT_GT(shared.seqs[3]->Cost().evicted_fraction, 0) << "trial " << trial;
  }
}

}  // namespace
}  // namespace kvtier::engine
