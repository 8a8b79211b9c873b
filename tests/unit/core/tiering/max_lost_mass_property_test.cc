// Randomized properties of quality-targeted eviction (Budgets::max_lost_mass, ε) over generated
// sequences re-tiered round after round: the evicted pages' estimated mass never exceeds ε,
// eviction stops only where the next page would cross it, ε = 0 evicts nothing, and ε = ∞ (or
// any ε larger than the whole estimate) is exactly fixed r.

#include <limits>
#include <random>

#include "core/tiering/lost_mass.h"
#include "core/tiering/policy.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Scenario {
  TieringConfig config;
  uint32_t groups = 1;
  uint64_t prompt = 0;
};

Scenario RandomScenario(std::mt19937_64& rng) {
  auto uni = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  Scenario run;
  const uint32_t page_choices[] = {1, 2, 4, 16};
  run.config.page_tokens = page_choices[uni(0, 3)];
  run.config.sink_tokens = static_cast<uint32_t>(uni(0, 4));
  run.config.window_tokens = static_cast<uint32_t>(uni(0, 64));
  run.config.protect_prompt = uni(0, 1) == 0;
  run.config.budgets.evict_ratio = uni(1, 1000) / 1000.0;
  run.config.budgets.compress_ratio =
      uni(0, 1000 - uni(0, 1000)) / 1000.0 * (1 - run.config.budgets.evict_ratio);
  run.config.budgets.hbm_ratio = uni(0, 1000) / 1000.0;
  run.groups = static_cast<uint32_t>(uni(1, 3));
  run.prompt = uni(0, 200);
  return run;
}

// Cumulative token scores of a growing sequence, frozen where a placement evicted them:
// scores[group][page] (sum mode), gaining random mass per step spread over live pages.
struct Scores {
  std::vector<std::vector<float>> pages;

  void Grow(std::mt19937_64& rng, const Placement& placement, uint32_t pages_now, double steps) {
    std::exponential_distribution<float> gain(1.0f);
    for (uint32_t g = 0; g < pages.size(); ++g) {
      pages[g].resize(pages_now, 0.f);
      for (uint32_t p = 0; p < pages_now; ++p) {
        const bool evicted = p < placement.num_pages && placement.at(g, p) == Tier::kT3;
        // Every 7th page draws nothing: its estimate is 0, and ε = 0 must still keep it.
        if (!evicted && p % 7 != 3)
          pages[g][p] += static_cast<float>(steps) * gain(rng) / pages_now;
      }
    }
  }
  std::vector<float> Flat() const {
    std::vector<float> flat;
    for (const auto& g : pages) flat.insert(flat.end(), g.begin(), g.end());
    return flat;
  }
};

double GroupEstimate(const Placement& p, const Scores& scores, uint32_t g, uint32_t page_tokens,
                     uint64_t length) {
  auto tiers = absl::MakeConstSpan(p.tiers).subspan(size_t{g} * p.num_pages, p.num_pages);
  return EvictedMassEstimate(scores.pages[g], tiers, page_tokens, length);
}

uint64_t Evicted(const Placement& p) {
  uint64_t n = 0;
  for (Tier t : p.tiers) n += t == Tier::kT3;
  return n;
}

// One decision of `config` from `current`; fails the test on error.
Placement Decide(const TieringConfig& config, const Scenario& run, uint64_t length,
                 const Placement& current, const std::vector<float>& scores) {
  auto policy = MakePolicy("hierarchy", config);
  EXPECT_TRUE(policy.ok()) << policy.status();
  auto d = (*policy)->Decide({{run.prompt, length}, current, scores});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : current;
}

TEST(MaxLostMassPropertyTest, EvictsOnlyWithinEpsilonAndStopsOnlyWhereTheNextPageCrossesIt) {
  std::mt19937_64 rng(20261206);
  uint64_t cut_short = 0, evicted_somewhere = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Scenario run = RandomScenario(rng);
    const double epsilon = std::uniform_real_distribution<double>(0.001, 0.5)(rng);
    TieringConfig bounded = run.config;
    bounded.budgets.max_lost_mass = epsilon;
    const uint32_t pt = run.config.page_tokens;
    Placement current{run.groups, 0, {}};
    Scores scores{std::vector<std::vector<float>>(run.groups)};
    uint64_t length = run.prompt;
    for (int round = 0; round < 12; ++round) {
      const uint64_t steps = 1 + std::uniform_int_distribution<uint64_t>(0, 64)(rng);
      length += steps;
      const auto pages = static_cast<uint32_t>((length + pt - 1) / pt);
      scores.Grow(rng, current, pages, static_cast<double>(steps));
      const std::vector<float> flat = scores.Flat();
      const Placement target = Decide(bounded, run, length, current, flat);
      const Placement fixed_r = Decide(run.config, run, length, current, flat);
      for (uint32_t g = 0; g < run.groups; ++g) {
        const double mass = GroupEstimate(target, scores, g, pt, length);
        ASSERT_LE(mass, epsilon * (1 + 1e-9)) << "trial " << trial << " round " << round;
        uint64_t evicted = 0, wanted = 0, lowest_live = UINT32_MAX;
        for (uint32_t p = 0; p < pages; ++p) {
          const Tier now = p < current.num_pages ? current.at(g, p) : Tier::kT0;
          // Monotone, and never evicting what fixed r would keep.
          if (now == Tier::kT3) {
            ASSERT_EQ(target.at(g, p), Tier::kT3);
          }
          if (target.at(g, p) == Tier::kT3) {
            ASSERT_EQ(fixed_r.at(g, p), Tier::kT3);
          }
          evicted += target.at(g, p) == Tier::kT3;
          wanted += fixed_r.at(g, p) == Tier::kT3;
          // The lowest-ranked page fixed r evicts and ε kept.
          if (fixed_r.at(g, p) == Tier::kT3 && target.at(g, p) != Tier::kT3 &&
              (lowest_live == UINT32_MAX ||
               RankKey(scores.pages[g][p], p) <
                   RankKey(scores.pages[g][lowest_live], static_cast<uint32_t>(lowest_live)))) {
            lowest_live = p;
          }
        }
        if (evicted < wanted) {
          ++cut_short;
          const auto p = static_cast<uint32_t>(lowest_live);
          ASSERT_GT(mass + PageMassEstimate(scores.pages[g][p], p, pt, length), epsilon)
              << "eviction stopped before ε was reached (trial " << trial << ")";
        }
        evicted_somewhere += evicted > 0;
      }
      current = target;
    }
  }
  // Both sides of ε were exercised.
  EXPECT_GT(cut_short, 100u);
  EXPECT_GT(evicted_somewhere, 100u);
}

TEST(MaxLostMassPropertyTest, ZeroEvictsNothingAndInfinityOrAHugeEpsilonIsFixedRatio) {
  std::mt19937_64 rng(33);
  uint64_t evicted_by_r = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Scenario run = RandomScenario(rng);
    TieringConfig zero = run.config, infinite = run.config, huge = run.config;
    zero.budgets.max_lost_mass = 0;
    infinite.budgets.max_lost_mass = kInf;
    huge.budgets.max_lost_mass = 1e30;  // finite: the ε path runs and must change nothing
    run.config.budgets.max_lost_mass = kInf;
    Placement at_r{run.groups, 0, {}}, at_zero = at_r, at_inf = at_r, at_huge = at_r;
    Scores scores{std::vector<std::vector<float>>(run.groups)};
    uint64_t length = run.prompt;
    for (int round = 0; round < 8; ++round) {
      const uint64_t steps = 1 + std::uniform_int_distribution<uint64_t>(0, 64)(rng);
      length += steps;
      const auto pages =
          static_cast<uint32_t>((length + run.config.page_tokens - 1) / run.config.page_tokens);
      scores.Grow(rng, at_r, pages, static_cast<double>(steps));
      const std::vector<float> flat = scores.Flat();
      at_r = Decide(run.config, run, length, at_r, flat);
      at_zero = Decide(zero, run, length, at_zero, flat);
      at_inf = Decide(infinite, run, length, at_inf, flat);
      at_huge = Decide(huge, run, length, at_huge, flat);
      ASSERT_EQ(Evicted(at_zero), 0u) << "trial " << trial;
      ASSERT_EQ(at_inf, at_r) << "trial " << trial;
      ASSERT_EQ(at_huge, at_r) << "trial " << trial;
    }
    evicted_by_r += Evicted(at_r) > 0;
  }
  EXPECT_GT(evicted_by_r, 100u) << "fixed r evicted too rarely for the comparison to mean much";
}

TEST(MaxLostMassTest, RejectsNegativeOrNanEpsilonNamingTheField) {
  TieringConfig config;
  config.budgets.max_lost_mass = -0.1;
  absl::Status s = config.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("budgets.max_lost_mass"), std::string::npos) << s;
  config.budgets.max_lost_mass = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(config.Validate().ok());
  config.budgets.max_lost_mass = kInf;
  EXPECT_TRUE(config.Validate().ok());
}

}  // namespace
}  // namespace kvtier::tiering
