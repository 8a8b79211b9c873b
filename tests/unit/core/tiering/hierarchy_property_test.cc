// Randomized property tests of the hierarchy policy and plans over thousands of generated
// sequences and configurations, against the naive model in reference.h.

#include <algorithm>
#include <random>

#include "core/tiering/plan.h"
#include "core/tiering/policy.h"
#include "gtest/gtest.h"
#include "tests/unit/core/tiering/reference.h"

namespace kvtier::tiering {
namespace {

using testing::RefConfig;
using testing::RefGroupResult;
using testing::RefProtectedPages;
using testing::RefSelect;

struct Scenario {
  RefConfig ref;
  TieringConfig config;
  uint32_t groups = 1;
  uint64_t prompt = 0;
  bool ties = false;  // scores drawn from {0, 1, 2, 3}: many ties
};

Scenario RandomScenario(std::mt19937_64& rng) {
  auto uni = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  Scenario s;
  const uint32_t page_choices[] = {1, 1, 2, 3, 4, 16};
  s.ref.page_tokens = page_choices[uni(0, 5)];
  s.ref.sink_tokens = static_cast<uint32_t>(uni(0, 8));
  s.ref.window_tokens = static_cast<uint32_t>(uni(0, 3) == 0 ? 0 : uni(1, 160));
  s.ref.protect_prompt = uni(0, 3) != 0;
  s.ref.evict_milli = static_cast<uint32_t>(uni(0, 4) == 0 ? 0 : uni(0, 1000));
  s.ref.compress_milli = static_cast<uint32_t>(uni(0, 1000 - s.ref.evict_milli));
  if (uni(0, 3) == 0) s.ref.compress_milli = 0;
  s.ref.hbm_milli = static_cast<uint32_t>(uni(0, 4) == 0 ? 1000 : uni(0, 1000));
  s.groups = static_cast<uint32_t>(uni(1, 3));
  s.prompt = uni(0, 3) == 0 ? 0 : uni(1, 300);
  s.ties = uni(0, 3) == 0;
  s.config.page_tokens = s.ref.page_tokens;
  s.config.sink_tokens = s.ref.sink_tokens;
  s.config.window_tokens = s.ref.window_tokens;
  s.config.protect_prompt = s.ref.protect_prompt;
  s.config.budgets = {.evict_ratio = s.ref.evict_milli / 1000.0,
                      .hbm_ratio = s.ref.hbm_milli / 1000.0,
                      .compress_ratio = s.ref.compress_milli / 1000.0};
  return s;
}

uint64_t TierTokens(const Placement& p, uint32_t g, Tier tier, uint64_t length,
                    uint32_t page_tokens) {
  uint64_t tokens = 0;
  for (uint32_t page = 0; page < p.num_pages; ++page) {
    if (p.at(g, page) != tier) continue;
    tokens +=
        std::min<uint64_t>(length, uint64_t{page + 1} * page_tokens) - uint64_t{page} * page_tokens;
  }
  return tokens;
}

// Checks the plan from `current` to `target`: applying it yields the target, no page moves
// twice, demotions precede promotions, T0 never exceeds its larger end, lossy iff out of T2.
void CheckPlan(const Placement& current, const Placement& target) {
  auto plan = MakePlan(current, target);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto applied = ApplyPlan(current, *plan, target.num_pages);
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_EQ(*applied, target);
  std::vector<bool> seen(target.tiers.size(), false);
  bool promoted = false;
  auto t0_pages = [](const Placement& p, uint32_t pages) {
    int64_t n = 0;
    for (uint32_t g = 0; g < p.num_groups; ++g) {
      for (uint32_t q = 0; q < pages; ++q) n += q >= p.num_pages || p.at(g, q) == Tier::kT0;
    }
    return n;
  };
  int64_t t0 = t0_pages(current, target.num_pages);
  const int64_t limit = std::max(t0, t0_pages(target, target.num_pages));
  for (const Move& m : plan->moves) {
    const size_t idx = size_t{m.group} * target.num_pages + m.page;
    ASSERT_FALSE(seen[idx]) << "page moved twice: group " << m.group << " page " << m.page;
    seen[idx] = true;
    ASSERT_NE(m.from, m.to);
    ASSERT_EQ(m.lossy, m.from == Tier::kT2);
    if (m.to == Tier::kT0) promoted = true;
    if (m.from == Tier::kT0) {
      ASSERT_FALSE(promoted) << "demotion after a promotion";
    }
    t0 += (m.to == Tier::kT0) - (m.from == Tier::kT0);
    ASSERT_LE(t0, limit);
  }
}

// Runs one scenario through several re-tierings as the sequence grows.
void RunScenario(const Scenario& s, std::mt19937_64& rng, int rounds) {
  auto policy = MakePolicy("hierarchy", s.config);
  ASSERT_TRUE(policy.ok()) << policy.status();
  Placement current{.num_groups = s.groups, .num_pages = 0, .tiers = {}};
  uint64_t length = s.prompt;
  std::uniform_real_distribution<float> real(0.0f, 10.0f);
  std::uniform_int_distribution<int> tie(0, 3);
  for (int round = 0; round < rounds; ++round) {
    length += std::uniform_int_distribution<uint64_t>(1, 400)(rng);
    const uint32_t pt = s.ref.page_tokens;
    const uint32_t pages = static_cast<uint32_t>((length + pt - 1) / pt);
    std::vector<float> scores(size_t{s.groups} * pages);
    for (float& x : scores) x = s.ties ? static_cast<float>(tie(rng)) : real(rng);
    const SequenceState seq{.prompt_tokens = s.prompt, .length = length};
    auto decision = (*policy)->DecideDetailed(
        DecisionInput{.sequence = seq, .current = current, .page_scores = scores});
    ASSERT_TRUE(decision.ok()) << decision.status();
    const Placement& target = decision->placement;
    ASSERT_EQ(target.num_pages, pages);
    ASSERT_EQ(target.num_groups, s.groups);
    const std::vector<bool> prot = RefProtectedPages(s.ref, s.prompt, length);
    for (uint32_t g = 0; g < s.groups; ++g) {
      std::vector<float> gs(scores.begin() + size_t{g} * pages,
                            scores.begin() + size_t{g + 1} * pages);
      std::vector<Tier> cur(current.tiers.begin() + size_t{g} * current.num_pages,
                            current.tiers.begin() + size_t{g + 1} * current.num_pages);
      const RefGroupResult ref = RefSelect(s.ref, s.prompt, length, gs, cur);
      const GroupStats& st = decision->groups[g];
      // Same decision as the full-sort model, page for page.
      std::vector<Tier> got(target.tiers.begin() + size_t{g} * pages,
                            target.tiers.begin() + size_t{g + 1} * pages);
      ASSERT_EQ(got, ref.tiers) << "group " << g << " length " << length;
      // Protected pages never leave T0.
      for (uint32_t p = 0; p < pages; ++p) {
        if (prot[p]) {
          ASSERT_EQ(target.at(g, p), Tier::kT0) << "protected page " << p;
        }
      }
      // Evicted set is monotone and exactly floor(r × eligible) rounded down to pages.
      for (uint32_t p = 0; p < current.num_pages; ++p) {
        if (current.at(g, p) == Tier::kT3) {
          ASSERT_EQ(target.at(g, p), Tier::kT3);
        }
      }
      const uint64_t eligible = std::count(prot.begin(), prot.end(), false) * uint64_t{pt};
      const uint64_t evicted_tokens = TierTokens(target, g, Tier::kT3, length, pt);
      ASSERT_EQ(evicted_tokens, (uint64_t{s.ref.evict_milli} * eligible / 1000) / pt * pt);
      ASSERT_EQ(st.evicted_pages * pt, evicted_tokens);
      // T0 within ceil(β × live) unless protected pages alone exceed it, which is reported.
      const uint64_t t0_tokens = TierTokens(target, g, Tier::kT0, length, pt);
      const uint64_t budget = (uint64_t{s.ref.hbm_milli} * (length - evicted_tokens) + 999) / 1000;
      ASSERT_EQ(st.t0_budget_tokens, budget);
      if (st.protected_tokens > budget) {
        ASSERT_EQ(st.overflow_tokens, st.protected_tokens - budget);
        ASSERT_EQ(t0_tokens, st.protected_tokens);
        ASSERT_GE(decision->protected_overflow_tokens, st.overflow_tokens);
      } else {
        ASSERT_EQ(st.overflow_tokens, 0u);
        ASSERT_LE(t0_tokens, budget);
      }
      for (int t = 0; t < kNumTiers; ++t) {
        ASSERT_EQ(st.pages[t],
                  static_cast<uint64_t>(std::count(got.begin(), got.end(), static_cast<Tier>(t))));
      }
    }
    CheckPlan(current, target);
    if (::testing::Test::HasFatalFailure()) return;
    // The worker's fallback: the same evictions and promotions, no move into T1 or T2.
    auto local = WithoutNewOffloads(current, target);
    ASSERT_TRUE(local.ok()) << local.status();
    auto local_plan = MakePlan(current, *local);
    ASSERT_TRUE(local_plan.ok());
    for (const Move& m : local_plan->moves) {
      ASSERT_TRUE(m.to == Tier::kT0 || m.to == Tier::kT3);
    }
    for (size_t i = 0; i < target.tiers.size(); ++i) {
      if (target.tiers[i] == Tier::kT0 || target.tiers[i] == Tier::kT3) {
        ASSERT_EQ(local->tiers[i], target.tiers[i]);
      }
    }
    current = target;
  }
}

TEST(HierarchyPropertyTest, MatchesFullSortModelAndKeepsEveryInvariant) {
  std::mt19937_64 rng(20261129);
  for (int i = 0; i < 2000; ++i) {
    const Scenario s = RandomScenario(rng);
    SCOPED_TRACE(::testing::Message()
                 << "scenario " << i << " pt=" << s.ref.page_tokens << " sink=" << s.ref.sink_tokens
                 << " window=" << s.ref.window_tokens << " prompt=" << s.prompt
                 << " protect=" << s.ref.protect_prompt << " r=" << s.ref.evict_milli << " beta="
                 << s.ref.hbm_milli << " gamma=" << s.ref.compress_milli << " groups=" << s.groups);
    RunScenario(s, rng, 6);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The partial selection and the full sort decide identically (ties broken by page).
TEST(HierarchyPropertyTest, NthElementAndFullSortAgree) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 500; ++i) {
    const Scenario s = RandomScenario(rng);
    const uint64_t length = s.prompt + std::uniform_int_distribution<uint64_t>(1, 3000)(rng);
    const SequenceState seq{.prompt_tokens = s.prompt, .length = length};
    const ProtectedPages prot = HierarchyProtectedPages(s.config, seq);
    std::vector<float> scores(prot.num_pages);
    std::uniform_int_distribution<int> tie(0, 5);
    for (float& x : scores) x = static_cast<float>(tie(rng));
    std::vector<Tier> a(prot.num_pages), b(prot.num_pages);
    auto sa = SelectGroup(scores, {}, prot, s.ref.page_tokens, length, s.config.budgets, 0,
                          absl::MakeSpan(a), nullptr, SelectMethod::kNthElement);
    auto sb = SelectGroup(scores, {}, prot, s.ref.page_tokens, length, s.config.budgets, 0,
                          absl::MakeSpan(b), nullptr, SelectMethod::kFullSort);
    ASSERT_TRUE(sa.ok() && sb.ok());
    ASSERT_EQ(a, b) << "scenario " << i;
  }
}

// The evicted fraction of eligible tokens never exceeds r, whatever the number of re-tierings
// (the published prototype's per-round fraction compounded to ~23% at "3%").
TEST(HierarchyPropertyTest, EvictionDoesNotCompoundOverRounds) {
  TieringConfig config;
  config.page_tokens = 1;
  config.budgets.evict_ratio = 0.03;
  auto policy = MakePolicy("hierarchy", config);
  ASSERT_TRUE(policy.ok());
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> real(0.0f, 1.0f);
  Placement current{.num_groups = 1, .num_pages = 0, .tiers = {}};
  const uint64_t prompt = 100;
  for (uint64_t length = prompt + 64; length <= 6000; length += 64) {
    std::vector<float> scores(length);
    for (float& x : scores) x = real(rng);
    auto target = (*policy)->Decide({.sequence = {.prompt_tokens = prompt, .length = length},
                                     .current = current,
                                     .page_scores = scores});
    ASSERT_TRUE(target.ok()) << target.status();
    current = *target;
  }
  const uint64_t evicted = std::count(current.tiers.begin(), current.tiers.end(), Tier::kT3);
  const uint64_t eligible = current.num_pages - prompt - config.sink_tokens - config.window_tokens;
  EXPECT_EQ(evicted, eligible * 3 / 100);
}

}  // namespace
}  // namespace kvtier::tiering
