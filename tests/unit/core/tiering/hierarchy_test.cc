// The worked examples of docs/tiering.md as table tests, the page-level baselines (full,
// streaming) and bad input.

#include <algorithm>
#include <cmath>

#include "core/tiering/plan.h"
#include "core/tiering/policy.h"
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

TieringConfig Config(uint32_t page_tokens, uint32_t sink, uint32_t window, Budgets b) {
  TieringConfig c;
  c.page_tokens = page_tokens;
  c.sink_tokens = sink;
  c.window_tokens = window;
  c.budgets = b;
  return c;
}

std::unique_ptr<Policy> Make(std::string_view name, const TieringConfig& c) {
  auto p = MakePolicy(name, c);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

// docs/tiering.md, example 1: P = 4, L = 20, page_tokens 1, 2 sinks, window 4,
// r = 0.25, β = 0.75, γ = 0.25.
const TieringConfig kExample =
    Config(1, 2, 4, {.evict_ratio = 0.25, .hbm_ratio = 0.75, .compress_ratio = 0.25});
const std::vector<float> kExample1Scores = {0,   0,    0,   0,   0,   0,   0.9, 0.1, 0.5, 0.3,
                                            0.8, 0.05, 0.7, 0.2, 0.6, 0.4, 0,   0,   0,   0};
const Placement kExample1Target =
    One({T0, T0, T0, T0, T0, T0, T0, T3, T1, T2, T0, T3, T0, T2, T0, T1, T0, T0, T0, T0});

TEST(HierarchyExamplesTest, Example1FirstReTiering) {
  auto policy = Make("hierarchy", kExample);
  Placement empty = One({});
  auto d = policy->DecideDetailed({.sequence = {.prompt_tokens = 4, .length = 20},
                                   .current = empty,
                                   .page_scores = kExample1Scores});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placement, kExample1Target);
  EXPECT_EQ(d->groups[0].candidate_pages, 10u);
  EXPECT_EQ(d->groups[0].evicted_pages, 2u);
  EXPECT_EQ(d->groups[0].t0_budget_tokens, 14u);
  EXPECT_EQ(d->groups[0].protected_tokens, 10u);
  EXPECT_EQ(d->protected_overflow_tokens, 0u);
}

TEST(HierarchyExamplesTest, Example2NextReTieringIsMonotoneAndPlansTwoMoves) {
  auto policy = Make("hierarchy", kExample);
  const std::vector<float> scores = {0,    0,    0,    0,    0,    0,   1.0,  0.1,
                                     0.55, 0.35, 0.9,  0.05, 0.75, 0.3, 0.65, 0.45,
                                     0.02, 0.5,  0.95, 0.6,  0,    0,   0,    0};
  auto d = policy->DecideDetailed({.sequence = {.prompt_tokens = 4, .length = 24},
                                   .current = kExample1Target,
                                   .page_scores = scores});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placement, One({T0, T0, T0, T0, T0, T0, T0, T3, T1, T2, T0, T3,
                               T0, T2, T0, T1, T3, T1, T0, T0, T0, T0, T0, T0}));
  EXPECT_EQ(d->groups[0].evicted_pages, 3u);
  EXPECT_EQ(d->groups[0].t0_budget_tokens, 16u);
  auto plan = MakePlan(kExample1Target, d->placement);
  ASSERT_TRUE(plan.ok());
  const std::vector<Move> expected = {
      {.group = 0, .page = 16, .from = T0, .to = T3, .lossy = false},
      {.group = 0, .page = 17, .from = T0, .to = T1, .lossy = false}};
  EXPECT_EQ(plan->moves, expected);
}

TEST(HierarchyExamplesTest, Example3ProtectedOverflowIsReported) {
  TieringConfig c = kExample;
  c.budgets.hbm_ratio = 0.5;
  auto policy = Make("hierarchy", c);
  Placement empty = One({});
  auto d = policy->DecideDetailed({.sequence = {.prompt_tokens = 4, .length = 20},
                                   .current = empty,
                                   .page_scores = kExample1Scores});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placement,
            One({T0, T0, T0, T0, T0, T0, T1, T3, T1, T2, T1, T3, T1, T2, T1, T1, T0, T0, T0, T0}));
  EXPECT_EQ(d->groups[0].t0_budget_tokens, 9u);
  EXPECT_EQ(d->protected_overflow_tokens, 1u);
}

TEST(HierarchyExamplesTest, Example4PagesRoundEvictionDown) {
  // page_tokens 4, P = 5, L = 37: pages 0,1 (prompt, sinks), 7,8 (window), 9 (partial)
  // are protected; 5 candidate pages = 20 eligible tokens; r = 0.5 → 10 tokens → 2 pages.
  auto policy =
      Make("hierarchy", Config(4, 2, 8, {.evict_ratio = 0.5, .hbm_ratio = 1, .compress_ratio = 0}));
  const std::vector<float> scores = {0, 0, 3, 1, 4, 2, 0.5, 0, 0, 0};
  Placement empty = One({});
  const SequenceState seq{.prompt_tokens = 5, .length = 37};
  auto d = policy->DecideDetailed({.sequence = seq, .current = empty, .page_scores = scores});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placement, One({T0, T0, T0, T3, T0, T0, T3, T0, T0, T0}));
  layout::KvGeometry g{.num_layers = 30,
                       .num_kv_heads = 3,
                       .head_dim = 64,
                       .element_bytes = 2,
                       .page_tokens = 4,
                       .layer_groups = 1};
  auto r = Report(d->placement, seq, g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->evicted_generated_fraction, 8.0 / 32.0);
  EXPECT_EQ(r->tokens[0], 29u);
  EXPECT_EQ(r->t0_bytes, 8u * 4 * 23040);
}

TEST(HierarchyExamplesTest, GroupsAreDecidedIndependently) {
  auto policy =
      Make("hierarchy", Config(1, 0, 0, {.evict_ratio = 0.5, .hbm_ratio = 1, .compress_ratio = 0}));
  Placement empty{.num_groups = 2, .num_pages = 0, .tiers = {}};
  const std::vector<float> scores = {1, 2, 3, 4, 4, 3, 2, 1};
  auto d = policy->Decide(
      {.sequence = {.prompt_tokens = 0, .length = 4}, .current = empty, .page_scores = scores});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tiers, (std::vector<Tier>{T3, T3, T0, T0, T0, T0, T3, T3}));
}

TEST(HierarchyExamplesTest, ZeroBudgetsKeepEverythingInT0) {
  auto policy = Make("hierarchy", Config(16, 4, 128, {}));
  std::vector<float> scores(70, 1.0f);
  Placement empty = One({});
  auto d = policy->Decide({.sequence = {.prompt_tokens = 100, .length = 1111},
                           .current = empty,
                           .page_scores = scores});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, One(std::vector<Tier>(70, T0)));
}

TEST(FullPolicyTest, KeepsEveryPageInT0AndRefusesAnEvictedPlacement) {
  auto policy = Make("full", kExample);
  EXPECT_FALSE(policy->NeedsWorkerState());
  Placement cur = One({T1, T2, T0});
  auto d = policy->Decide(
      {.sequence = {.prompt_tokens = 0, .length = 5}, .current = cur, .page_scores = {}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, One({T0, T0, T0, T0, T0}));
  Placement evicted = One({T0, T0, T0, T0, T0, T0, T0, T3});
  auto bad = policy->Decide(
      {.sequence = {.prompt_tokens = 0, .length = 20}, .current = evicted, .page_scores = {}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StreamingPolicyTest, KeepsExactlySinksAndWindowAtFullEviction) {
  TieringConfig c = Config(1, 2, 4, {.evict_ratio = 1, .hbm_ratio = 1, .compress_ratio = 0});
  c.protect_prompt = false;  // the published form: sinks are the sequence's first tokens
  auto policy = Make("streaming", c);
  Placement cur = One({});
  for (uint64_t length = 8; length <= 40; length += 3) {
    auto d = policy->Decide(
        {.sequence = {.prompt_tokens = 5, .length = length}, .current = cur, .page_scores = {}});
    ASSERT_TRUE(d.ok()) << d.status();
    for (uint32_t i = 0; i < length; ++i) {
      const bool kept = i < 2 || i + 4 >= length;
      EXPECT_EQ(d->at(0, i), kept ? T0 : T3) << "length " << length << " position " << i;
    }
    cur = *d;
  }
}

TEST(StreamingPolicyTest, EvictsOldestFirstAtPartialRatioWhateverTheScores) {
  auto policy = Make(
      "streaming", Config(1, 2, 4, {.evict_ratio = 0.5, .hbm_ratio = 0.1, .compress_ratio = 0.5}));
  Placement empty = One({});
  auto d = policy->Decide({.sequence = {.prompt_tokens = 4, .length = 20},
                           .current = empty,
                           .page_scores = kExample1Scores});
  ASSERT_TRUE(d.ok()) << d.status();
  // Prompt + sinks [0, 6), 5 oldest candidates [6, 11) evicted, the rest in T0.
  EXPECT_EQ(*d,
            One({T0, T0, T0, T0, T0, T0, T3, T3, T3, T3, T3, T0, T0, T0, T0, T0, T0, T0, T0, T0}));
}

TEST(PolicyFactoryTest, KnowsEveryNameAndWhichNeedWorkerState) {
  for (std::string_view name : kPolicyNames) {
    auto p = MakePolicy(name, TieringConfig{});
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->Name(), name);
    const bool worker = name == "h2o" || name == "rkv" || name == "arkv";
    EXPECT_EQ((*p)->NeedsWorkerState(), worker) << name;
    if (worker) {
      Placement empty = One({});
      auto d = (*p)->Decide({.sequence = {.prompt_tokens = 0, .length = 1},
                             .current = empty,
                             .page_scores = std::vector<float>{1.0f}});
      EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << name;
      EXPECT_THAT(d.status().message(), HasSubstr("worker"));
    }
  }
  auto unknown = MakePolicy("lru", TieringConfig{});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'lru'"));
  TieringConfig bad;
  bad.page_tokens = 0;
  EXPECT_THAT(MakePolicy("hierarchy", bad).status().message(), HasSubstr("page_tokens"));
}

// After a rollback (TieredSequence::Truncate) the window can reach back over evicted pages and
// the eviction budget shrink below them: they stay evicted, and nothing new is evicted.
TEST(HierarchyTest, EvictedPagesStayEvictedWhenProtectedOrOverTheBudget) {
  auto policy = Make("hierarchy", kExample);
  std::vector<float> ok20(20, 1.0f);
  auto d = policy->DecideDetailed({.sequence = {4, 20}, .current = One({T3}), .page_scores = ok20});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placement.at(0, 0), T3);  // in the protected prompt, and gone
  const Placement over = One({T0, T0, T0, T0, T0, T0, T3, T3, T3});
  d = policy->DecideDetailed({.sequence = {4, 20}, .current = over, .page_scores = ok20});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::count(d->placement.tiers.begin(), d->placement.tiers.end(), T3), 3);
  for (uint32_t p = 6; p < 9; ++p) EXPECT_EQ(d->placement.at(0, p), T3) << p;
}

struct BadInput {
  const char* name;
  SequenceState seq;
  Placement current;
  std::vector<float> scores;
  const char* message;
};

TEST(HierarchyBadInputTest, RejectsNamingFieldAndValueAndChangesNothing) {
  const float nan = std::nanf("");
  std::vector<float> ok20(20, 1.0f);
  std::vector<float> with_nan = ok20;
  with_nan[9] = nan;
  std::vector<float> with_inf = ok20;
  with_inf[3] = INFINITY;
  const BadInput cases[] = {
      {"nan", {4, 20}, One({}), with_nan, "page_scores[group 0, page 9] is nan"},
      {"inf", {4, 20}, One({}), with_inf, "page 3] is inf"},
      {"short", {4, 20}, One({}), std::vector<float>(19, 1.0f), "page_scores has 19"},
      {"placement too long",
       {4, 20},
       One(std::vector<Tier>(21, T0)),
       ok20,
       "current.num_pages (21)"},
      {"prompt past length", {30, 20}, One({}), ok20, "sequence.prompt_tokens (30)"},
      {"broken placement",
       {4, 20},
       Placement{.num_groups = 1, .num_pages = 3, .tiers = {T0}},
       ok20,
       "current.tiers has 1"},
      {"zero groups",
       {4, 20},
       Placement{.num_groups = 0, .num_pages = 0, .tiers = {}},
       ok20,
       "num_groups"},
  };
  auto policy = Make("hierarchy", kExample);
  for (const BadInput& c : cases) {
    const Placement before = c.current;
    auto d = policy->Decide({.sequence = c.seq, .current = c.current, .page_scores = c.scores});
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(d.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(c.current, before) << c.name;
  }
}

}  // namespace
}  // namespace kvtier::tiering
