// Randomized invariants of the page-level baselines (streaming, arkv) over growing sequences.

#include <algorithm>
#include <random>

#include "core/tiering/arkv.h"
#include "core/tiering/policy.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

uint64_t Uni(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

TieringConfig RandomConfig(std::mt19937_64& rng) {
  TieringConfig c;
  const uint32_t pages[] = {1, 2, 4, 16};
  c.page_tokens = pages[Uni(rng, 0, 3)];
  c.sink_tokens = static_cast<uint32_t>(Uni(rng, 0, 6));
  c.window_tokens = static_cast<uint32_t>(Uni(rng, 0, 100));
  c.protect_prompt = Uni(rng, 0, 1) == 1;
  c.budgets.evict_ratio = Uni(rng, 0, 3) == 0 ? 1.0 : static_cast<double>(Uni(rng, 0, 1000)) / 1000;
  return c;
}

// Pages holding a position of [begin, end), clipped to the sequence.
void MarkPositions(std::vector<bool>& pages, uint64_t begin, uint64_t end, uint64_t length,
                   uint32_t page_tokens) {
  for (uint64_t i = begin; i < std::min(end, length); ++i) pages[i / page_tokens] = true;
}

TEST(StreamingPropertyTest, EvictsExactlyTheOldestCandidatesAndNeverOffloads) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 600; ++trial) {
    const TieringConfig c = RandomConfig(rng);
    auto policy = MakePolicy("streaming", c);
    ASSERT_TRUE(policy.ok()) << policy.status();
    const uint64_t prompt = Uni(rng, 0, 200);
    const uint64_t r_milli = static_cast<uint64_t>(c.budgets.evict_ratio * 1000 + 0.5);
    Placement cur{.num_groups = 1, .num_pages = 0, .tiers = {}};
    uint64_t length = prompt;
    for (int round = 0; round < 5; ++round) {
      length += Uni(rng, 1, 300);
      auto d = (*policy)->Decide({.sequence = {.prompt_tokens = prompt, .length = length},
                                  .current = cur,
                                  .page_scores = {}});
      ASSERT_TRUE(d.ok()) << d.status();
      const uint64_t pages = d->num_pages;
      std::vector<bool> prot(pages, false);
      const uint64_t sink_begin = c.protect_prompt ? prompt : 0;
      if (c.protect_prompt) MarkPositions(prot, 0, prompt, length, c.page_tokens);
      MarkPositions(prot, sink_begin, sink_begin + c.sink_tokens, length, c.page_tokens);
      MarkPositions(prot, length > c.window_tokens ? length - c.window_tokens : 0, length, length,
                    c.page_tokens);
      if (length % c.page_tokens != 0) prot[pages - 1] = true;
      uint64_t candidates = 0, evicted = 0;
      bool live_seen = false;
      for (uint64_t p = 0; p < pages; ++p) {
        const Tier t = d->at(0, static_cast<uint32_t>(p));
        ASSERT_TRUE(t == Tier::kT0 || t == Tier::kT3) << "baseline offloaded page " << p;
        if (prot[p]) {
          ASSERT_EQ(t, Tier::kT0) << "protected page " << p;
          continue;
        }
        ++candidates;
        if (t == Tier::kT3) {
          ++evicted;
          ASSERT_FALSE(live_seen) << "evicted page " << p << " is newer than a live one";
        } else {
          live_seen = true;
        }
        if (p < cur.num_pages && cur.at(0, static_cast<uint32_t>(p)) == Tier::kT3) {
          ASSERT_EQ(t, Tier::kT3) << "resurrected page " << p;
        }
      }
      ASSERT_EQ(evicted, r_milli * candidates * c.page_tokens / 1000 / c.page_tokens);
      cur = *d;
    }
  }
}

TEST(ArkvPropertyTest, PerLayerEvictionIsExactAndSurvivorsSplitByOqRatio) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> score(0, 1);
  for (int trial = 0; trial < 400; ++trial) {
    TieringConfig c = RandomConfig(rng);
    c.budgets.evict_ratio = static_cast<double>(Uni(rng, 0, 1000)) / 1000;
    ArkvConfig arkv;
    arkv.recent_tokens = static_cast<uint32_t>(Uni(rng, 0, 64));
    const uint32_t layers = static_cast<uint32_t>(Uni(rng, 1, 4));
    std::vector<double> ratios(layers);
    for (double& r : ratios) r = static_cast<double>(Uni(rng, 0, 1000)) / 1000;
    const uint64_t prompt = Uni(rng, 0, 100);
    Placement cur{.num_groups = layers, .num_pages = 0, .tiers = {}};
    uint64_t length = prompt;
    for (int round = 0; round < 4; ++round) {
      length += Uni(rng, 1, 300);
      const uint32_t pages = static_cast<uint32_t>((length + c.page_tokens - 1) / c.page_tokens);
      std::vector<float> scores(uint64_t{layers} * pages);
      for (float& x : scores) x = score(rng);
      auto d = ArkvDecide({.sequence = {.prompt_tokens = prompt, .length = length},
                           .current = cur,
                           .page_scores = scores,
                           .oq_ratios = ratios},
                          c, arkv);
      ASSERT_TRUE(d.ok()) << d.status();
      for (uint32_t l = 0; l < layers; ++l) {
        const GroupStats& st = d->groups[l];
        const uint64_t target =
            FloorRatio(c.budgets.evict_ratio, st.candidate_pages * c.page_tokens) / c.page_tokens;
        ASSERT_EQ(st.pages[3], target);
        ASSERT_EQ(st.pages[1], 0u) << "ARKV has no T1";
        const uint64_t survivors = st.candidate_pages - target;
        ASSERT_EQ(st.pages[2], FloorRatio(1 - ratios[l], survivors));
        for (uint32_t p = 0; p < cur.num_pages; ++p) {
          if (cur.at(l, p) == Tier::kT3) {
            ASSERT_EQ(d->placement.at(l, p), Tier::kT3);
          }
        }
        // The last recent_tokens positions are Original.
        const uint64_t recent = std::min<uint64_t>(arkv.recent_tokens, length);
        for (uint64_t i = length - recent; i < length; ++i) {
          ASSERT_EQ(d->placement.at(l, static_cast<uint32_t>(i / c.page_tokens)), Tier::kT0);
        }
      }
      cur = d->placement;
    }
  }
}

}  // namespace
}  // namespace kvtier::tiering
