#include "core/tiering/plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;
constexpr Tier T0 = Tier::kT0, T1 = Tier::kT1, T2 = Tier::kT2, T3 = Tier::kT3;

Placement One(std::vector<Tier> tiers) {
  return Placement{
      .num_groups = 1, .num_pages = static_cast<uint32_t>(tiers.size()), .tiers = std::move(tiers)};
}

TEST(PlanTest, OrdersEvictOffloadCompressDecompressPromote) {
  const Placement cur = One({T1, T0, T2, T0, T1, T2, T0});
  const Placement tgt = One({T0, T1, T0, T2, T3, T1, T0});
  auto plan = MakePlan(cur, tgt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<Move> expected = {
      {.group = 0, .page = 4, .from = T1, .to = T3, .lossy = false},
      {.group = 0, .page = 1, .from = T0, .to = T1, .lossy = false},
      {.group = 0, .page = 3, .from = T0, .to = T2, .lossy = false},
      {.group = 0, .page = 5, .from = T2, .to = T1, .lossy = true},
      {.group = 0, .page = 0, .from = T1, .to = T0, .lossy = false},
      {.group = 0, .page = 2, .from = T2, .to = T0, .lossy = true},
  };
  EXPECT_EQ(plan->moves, expected);
  EXPECT_EQ(plan->Count(MoveKind::kPromote), 2u);
  EXPECT_EQ(plan->Count(MoveKind::kEvict), 1u);
  EXPECT_EQ(plan->Count(MoveKind::kDecompress), 1u);
}

TEST(PlanTest, NewPagesCountAsT0AndApplyYieldsTarget) {
  const Placement cur = One({T0, T1});
  const Placement tgt = One({T1, T1, T0, T2});
  auto plan = MakePlan(cur, tgt);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->moves.size(), 2u);  // page 0 offload, page 3 compress; page 2 stays T0
  auto applied = ApplyPlan(cur, *plan, 4);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(*applied, tgt);
}

TEST(PlanTest, WithoutNewOffloadsKeepsEvictionsAndPromotionsOnly) {
  const Placement cur = One({T0, T1, T2, T0, T1, T0});
  const Placement tgt = One({T1, T0, T1, T3, T2, T2, T0});
  auto local = WithoutNewOffloads(cur, tgt);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, One({T0, T0, T2, T3, T1, T0, T0}));
  auto plan = MakePlan(cur, *local);
  ASSERT_TRUE(plan.ok());
  for (const Move& m : plan->moves) EXPECT_TRUE(m.to == T0 || m.to == T3);
  EXPECT_FALSE(WithoutNewOffloads(One({T3}), One({T1})).ok());
}

TEST(PlanTest, RefusesToResurrectAnEvictedPage) {
  auto plan = MakePlan(One({T3, T0}), One({T1, T0}));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("evicted page 0"));
}

TEST(PlanTest, RejectsMismatchedShapes) {
  Placement two{.num_groups = 2, .num_pages = 1, .tiers = {T0, T0}};
  EXPECT_THAT(MakePlan(One({T0}), two).status().message(), HasSubstr("num_groups"));
  EXPECT_THAT(MakePlan(One({T0, T0}), One({T0})).status().message(),
              HasSubstr("current.num_pages"));
  Placement broken{.num_groups = 1, .num_pages = 3, .tiers = {T0}};
  EXPECT_THAT(MakePlan(broken, One({T0, T0, T0})).status().message(), HasSubstr("current.tiers"));
}

TEST(PlanTest, ApplyRejectsAMoveFromTheWrongTier) {
  Plan plan;
  plan.moves.push_back({.group = 0, .page = 0, .from = T1, .to = T0, .lossy = false});
  auto applied = ApplyPlan(One({T2}), plan, 1);
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(applied.status().message(), HasSubstr("plan.moves[0]"));
}

layout::KvGeometry Geometry(uint32_t page_tokens, uint32_t groups) {
  return layout::KvGeometry{.num_layers = 30,
                            .num_kv_heads = 3,
                            .head_dim = 64,
                            .element_bytes = 2,
                            .page_tokens = page_tokens,
                            .layer_groups = groups};
}

TEST(ReportTest, CountsTokensBytesAndCumulativeEvictedFraction) {
  // 10 positions, pages of 4: [0,4) [4,8) [8,10). Prompt 3.
  const Placement p = One({T0, T3, T1});
  auto r = Report(p, {.prompt_tokens = 3, .length = 10}, Geometry(4, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens[0], 4u);
  EXPECT_EQ(r->tokens[1], 2u);
  EXPECT_EQ(r->tokens[3], 4u);
  EXPECT_EQ(r->generated_tokens, 7u);
  EXPECT_DOUBLE_EQ(r->evicted_generated_fraction, 4.0 / 7.0);
  EXPECT_EQ(r->t0_bytes, 23040u * 4);  // one page of SmolLM2 fp16
  EXPECT_EQ(r->t1_bytes, 23040u * 4);
}

TEST(ReportTest, WeighsGroupsByTheirLayers) {
  // 2 groups of 15 layers; group 1 evicts its only generated page, group 0 nothing.
  Placement p{.num_groups = 2, .num_pages = 2, .tiers = {T0, T0, T0, T3}};
  auto r = Report(p, {.prompt_tokens = 4, .length = 8}, Geometry(4, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->evicted_generated_fraction, 0.5);
  EXPECT_EQ(r->group_tokens[1][3], 4u);
  EXPECT_EQ(r->t0_bytes, 3 * (23040u / 2) * 4);
}

TEST(PlanBytesTest, CountsFullPrecisionBytesPerKind) {
  Placement cur{.num_groups = 2, .num_pages = 3, .tiers = {T0, T0, T1, T0, T2, T0}};
  Placement tgt{.num_groups = 2, .num_pages = 3, .tiers = {T1, T1, T0, T0, T0, T3}};
  auto plan = MakePlan(cur, tgt);
  ASSERT_TRUE(plan.ok());
  auto bytes = PlanBytes(*plan, Geometry(4, 2));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const uint64_t page = 23040u / 2 * 4;  // 15 layers, 4 tokens
  EXPECT_EQ((*bytes)[static_cast<int>(MoveKind::kOffload)], 2 * page);
  EXPECT_EQ((*bytes)[static_cast<int>(MoveKind::kPromote)], 2 * page);
  EXPECT_EQ((*bytes)[static_cast<int>(MoveKind::kEvict)], page);
  EXPECT_THAT(PlanBytes(*plan, Geometry(4, 1)).status().message(), HasSubstr("layer_groups"));
}

TEST(T0BytesSeriesTest, TracksPeakAndMean) {
  T0BytesSeries s;
  EXPECT_EQ(s.mean(), 0.0);
  for (uint64_t b : {100u, 300u, 200u}) s.Add(b);
  EXPECT_EQ(s.peak(), 300u);
  EXPECT_DOUBLE_EQ(s.mean(), 200.0);
  EXPECT_EQ(s.count(), 3u);
}

TEST(ReportTest, RejectsGeometryThatDoesNotMatch) {
  EXPECT_THAT(
      Report(One({T0}), {.prompt_tokens = 0, .length = 4}, Geometry(4, 2)).status().message(),
      HasSubstr("layer_groups"));
  EXPECT_THAT(
      Report(One({T0}), {.prompt_tokens = 0, .length = 9}, Geometry(4, 1)).status().message(),
      HasSubstr("num_pages"));
  EXPECT_THAT(
      Report(One({T0}), {.prompt_tokens = 0, .length = 4}, Geometry(0, 1)).status().message(),
      HasSubstr("page_tokens"));
}

}  // namespace
}  // namespace kvtier::tiering
