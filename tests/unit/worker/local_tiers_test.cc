#include "worker/local_tiers.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::worker {
namespace {

using tiering::Tier;

TEST(LocalTiersTest, RunsAStoreThroughEveryTierAndFreesSlots) {
  auto tiers = LocalTiers::Create(
      {.arena_bytes = 64 << 20, .ddr_bytes = 16 << 20, .compressed_bytes = 16 << 20});
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  TieredKvStoreOptions o;
  o.geometry = {.num_layers = 30, .num_kv_heads = 3, .head_dim = 64, .page_tokens = 16};
  o.num_q_heads = 9;
  auto store = (*tiers)->NewStore(o);
  ASSERT_TRUE(store.ok()) << store.status();
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  std::vector<float> kv(48 * 3 * 64);
  for (float& x : kv) x = n(rng);
  for (uint32_t layer = 0; layer < 30; ++layer) {
    ASSERT_TRUE((*store)->Append(layer, kv.data(), kv.data(), 48).ok());
  }
  ASSERT_TRUE((*store)
                  ->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1},
                                    {0, 1, Tier::kT0, Tier::kT2},
                                    {0, 2, Tier::kT0, Tier::kT3}},
                                   (*tiers)->slots())
                  .ok());
  EXPECT_EQ((*tiers)->slots().GrantedSlots(PoolKind::kDdr), 1u);
  EXPECT_EQ((*tiers)->slots().GrantedSlots(PoolKind::kCompressed), 1u);
  std::vector<float> q(9 * 64, 0.1f), out(9 * 64), mass(48);
  ASSERT_TRUE((*store)->Attend(29, q.data(), 1, out.data(), mass.data()).ok());
  for (uint32_t p = 32; p < 48; ++p) EXPECT_EQ(mass[p], 0.f);
  for (const ReleasedSlot& s : (*store)->HeldSlots()) {
    ASSERT_TRUE((*tiers)->slots().Free(s.kind, s.offset).ok());
  }
  EXPECT_EQ((*tiers)->slots().GrantedBytes(PoolKind::kDdr), 0u);
}

TEST(LocalTiersTest, WithoutPoolsRejectsOffloads) {
  auto tiers = LocalTiers::Create({.arena_bytes = 64 << 20, .ddr_bytes = 0, .compressed_bytes = 0});
  ASSERT_TRUE(tiers.ok());
  EXPECT_EQ((*tiers)->memory().ddr_pool, nullptr);
  EXPECT_EQ(LocalTiers::Create({.arena_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::worker
