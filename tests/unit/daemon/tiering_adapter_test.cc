#include "daemon/tiering_adapter.h"

#include <cmath>
#include <random>

#include "core/tiering/config.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using tiering::Placement;
using tiering::Tier;

v1::PolicyConfig Hierarchy(double hbm, double evict, double compress) {
  v1::PolicyConfig c;
  c.set_name("hierarchy");
  c.set_hbm_ratio(hbm);
  c.set_evict_ratio(evict);
  c.set_compress_ratio(compress);
  c.set_protect_prompt(true);
  return c;
}

TEST(TieringAdapterTest, ValidatePolicyNamesFieldAndValue) {
  struct Case {
    v1::PolicyConfig c;
    const char* field;
  };
  std::vector<Case> cases;
  v1::PolicyConfig c = Hierarchy(0.5, 0.1, 0.1);
  c.set_name("magic");
  cases.push_back({c, "policy.name"});
  c = Hierarchy(0.5, 0.1, 0.1);
  c.set_name("h2o");
  cases.push_back({c, "policy.name"});
  cases.push_back({Hierarchy(1.5, 0, 0), "policy.hbm_ratio"});
  cases.push_back({Hierarchy(NAN, 0, 0), "policy.hbm_ratio"});
  cases.push_back({Hierarchy(0.5, -0.1, 0), "policy.evict_ratio"});
  cases.push_back({Hierarchy(0.5, 0, INFINITY), "policy.compress_ratio"});
  cases.push_back({Hierarchy(0.5, 0.6, 0.6), "policy.evict_ratio + policy.compress_ratio"});
  c = Hierarchy(0.5, 0, 0);
  c.set_window_tokens(1u << 30);
  cases.push_back({c, "policy.window_tokens"});
  for (const Case& k : cases) {
    auto r = ValidatePolicy(k.c, 16);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(k.field), std::string::npos) << r.status();
  }
  auto ok = ValidatePolicy(Hierarchy(0.5, 0.1, 0.2), 16);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->window_tokens, 128u);
  EXPECT_EQ(ok->sink_tokens, 4u);
}

// Budget properties on random scores: protected pages stay T0, T3 is monotone, the evicted share
// never exceeds floor(r x eligible), and T0 holds at most ceil(beta x live) unless protected
// pages alone exceed it.
TEST(TieringAdapterTest, HierarchyHoldsBudgetsOnRandomScores) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t pt = 1 + rng() % 16;
    double hbm = (rng() % 101) / 100.0, evict = (rng() % 51) / 100.0;
    double compress = (rng() % 51) / 100.0;
    auto pol = ValidatePolicy(Hierarchy(hbm, evict, compress), pt);
    ASSERT_TRUE(pol.ok());
    const uint64_t prompt = rng() % 300;
    Placement cur{1, 0, {}};
    uint64_t length = prompt;
    for (int round = 0; round < 5; ++round) {
      length += 1 + rng() % 400;
      uint32_t n = static_cast<uint32_t>((length + pt - 1) / pt);
      cur.tiers.resize(n, Tier::kT0);
      cur.num_pages = n;
      std::vector<float> scores(n);
      for (float& s : scores) s = static_cast<float>(rng() % 1000);
      auto d = DecidePlacement(*pol, {.prompt_tokens = prompt, .length = length}, cur, scores);
      ASSERT_TRUE(d.ok());
      uint64_t eligible = 0, evicted = 0, t0 = 0, live = 0, prot = 0;
      for (uint32_t p = 0; p < n; ++p) {
        uint64_t b = uint64_t{p} * pt, e = std::min<uint64_t>(b + pt, length);
        bool is_prot =
            b < prompt || (b < prompt + 4 && e > prompt) || e > (length > 128 ? length - 128 : 0);
        Tier t = d->target.tiers[p];
        if (cur.tiers[p] == Tier::kT3) {
          ASSERT_EQ(t, Tier::kT3);
        }
        if (is_prot) {
          ASSERT_EQ(t, Tier::kT0) << "protected page " << p;
          prot += e - b;
        } else {
          eligible += e - b;
        }
        if (t == Tier::kT3) evicted += e - b;
        if (t != Tier::kT3) live += e - b;
        if (t == Tier::kT0) t0 += e - b;
      }
      const uint64_t target = tiering::FloorRatio(evict, eligible);
      ASSERT_LE(evicted, target);
      // Round-down to pages: less than one page below the target.
      ASSERT_GT(evicted + pt, target);
      uint64_t cap = tiering::CeilRatio(hbm, live);
      ASSERT_LE(t0, std::max(cap, prot));
      EXPECT_EQ(d->protected_overflow, prot > cap);
      cur = d->target;
    }
  }
}

TEST(TieringAdapterTest, ZeroEvictionAndCompressionUsesOnlyT0AndT1) {
  auto pol = ValidatePolicy(Hierarchy(0.2, 0, 0), 16);
  ASSERT_TRUE(pol.ok());
  Placement cur{2, 64, std::vector<Tier>(128, Tier::kT0)};
  std::vector<float> scores(128);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>(i % 7);
  auto d = DecidePlacement(*pol, {.prompt_tokens = 100, .length = 64 * 16}, cur, scores);
  ASSERT_TRUE(d.ok());
  int t1 = 0;
  for (Tier t : d->target.tiers) {
    EXPECT_TRUE(t == Tier::kT0 || t == Tier::kT1);
    t1 += t == Tier::kT1;
  }
  EXPECT_GT(t1, 0);
}

TEST(TieringAdapterTest, OrderedMovesPutDemotionsFirst) {
  Placement cur{1, 4, {Tier::kT1, Tier::kT0, Tier::kT2, Tier::kT0}};
  Placement tgt{1, 4, {Tier::kT0, Tier::kT1, Tier::kT1, Tier::kT3}};
  auto moves = OrderedMoves(cur, tgt);
  ASSERT_TRUE(moves.ok());
  ASSERT_EQ(moves->size(), 4u);
  // Evictions, offloads, (compressions,) decompressions, promotions.
  EXPECT_EQ((*moves)[0].to, Tier::kT3);
  EXPECT_EQ((*moves)[1].to, Tier::kT1);
  EXPECT_EQ((*moves)[1].from, Tier::kT0);
  EXPECT_EQ((*moves)[2].from, Tier::kT2);
  EXPECT_EQ((*moves)[3].to, Tier::kT0);
  bool promoted = false;
  for (const auto& m : *moves) {
    if (m.to < m.from) promoted = true;
    if (promoted) {
      EXPECT_LT(m.to, m.from) << "a demotion after a promotion";
    }
  }
  // An evicted page never comes back: the diff refuses it.
  EXPECT_FALSE(OrderedMoves(tgt, cur).ok());
}

}  // namespace
}  // namespace kvtier::daemon
