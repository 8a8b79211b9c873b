// The engine over the tiered KV store (worker/tiered_kv_store.h) on the real model: the
// zero-error property end to end (DESIGN §1/§6) — with no T2/T3 page, logits are bit-identical
// whatever the T0/T1 split — and agreement with the engine's DenseAttentionCache.

#include <random>

#include "engine/dense_attention_cache.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "tests/e2e/engine/engine_test_util.h"
#include "tests/unit/worker/store_rig.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::engine {
namespace {

using ::kvtier::tiering::Move;
using ::kvtier::tiering::Tier;
using ::kvtier::worker::TieredKvStore;
using ::kvtier::worker::TieredKvStoreOptions;
using ::kvtier::worker::testing::Rig;

TieredKvStoreOptions StoreOptions(const Model& m, uint32_t page_tokens) {
  TieredKvStoreOptions o;
  o.geometry.num_layers = m.config().num_layers;
  o.geometry.num_kv_heads = m.config().num_kv_heads;
  o.geometry.head_dim = m.config().head_dim;
  o.geometry.element_bytes = 4;
  o.geometry.page_tokens = page_tokens;
  o.geometry.layer_groups = 1;
  o.num_q_heads = m.config().num_heads;
  o.scale = m.attention_shape().scale;
  return o;
}

// Moves about half of the pages between T0 and T1 (never T2/T3).
void ShuffleT0T1(TieredKvStore& store, Rig& rig, std::mt19937& rng) {
  std::vector<Move> moves;
  std::bernoulli_distribution pick(0.5);
  for (uint32_t page = 0; page < store.num_pages(); ++page) {
    if (!pick(rng)) continue;
    const Tier from = store.TierOf(0, page);
    moves.push_back({0, page, from, from == Tier::kT0 ? Tier::kT1 : Tier::kT0});
  }
  ASSERT_TRUE(store.ApplyPlanLocal(moves, *rig.slots).ok());
}

TEST(EngineTieredStoreTest, LogitsBitIdenticalWhateverTheT0T1Split) {
  KVTIER_REQUIRE_MODEL(model, 2);
  std::vector<ChatMessage> msgs = {{"user", "List three facts about the moon."}};
  const auto prompt = model->tokenizer().Encode(ApplyChatTemplate(msgs, true));
  Rig rig;
  auto all_t0 = rig.MakeStore(StoreOptions(*model, 16));
  auto moved = rig.MakeStore(StoreOptions(*model, 16));
  DenseAttentionCache dense(model->attention_shape());
  ASSERT_TRUE(all_t0 && moved);
  std::vector<float> l0, l1, ld;
  ASSERT_TRUE(model->Prefill(prompt, *all_t0, &l0).ok());
  ASSERT_TRUE(model->Prefill(prompt, *moved, &l1).ok());
  ASSERT_TRUE(model->Prefill(prompt, dense, &ld).ok());
  std::mt19937 rng(7);
  float worst = 0;
  for (int step = 0; step < 24; ++step) {
    ASSERT_EQ(l0, l1) << "step " << step;
    for (size_t i = 0; i < l0.size(); ++i) worst = std::max(worst, std::fabs(l0[i] - ld[i]));
    const int32_t tok = Sampler::Argmax(l0);
    ASSERT_EQ(tok, Sampler::Argmax(ld)) << "step " << step;
    ASSERT_NO_FATAL_FAILURE(ShuffleT0T1(*moved, rig, rng));
    std::vector<DecodeRequest> batch = {
        {tok, all_t0.get(), &l0}, {tok, moved.get(), &l1}, {tok, &dense, &ld}};
    ASSERT_TRUE(model->Decode(batch).ok());
  }
  int t1_pages = 0;
  for (uint32_t p = 0; p < moved->num_pages(); ++p) t1_pages += moved->TierOf(0, p) == Tier::kT1;
  EXPECT_GT(t1_pages, 0);
  std::printf("tiered store vs DenseAttentionCache: max |dlogit| %.2e over 24 steps\n", worst);
  EXPECT_LT(worst, 1e-3f);
}

}  // namespace
}  // namespace kvtier::engine
