#include "daemon/placement_figures.h"

#include <gtest/gtest.h>

#include <random>

#include "core/tiering/plan.h"

namespace kvtier::daemon {
namespace {

// A random KV geometry: 1-30 layers in 1..layers groups, pages of 1, 3, 16 or 64 tokens.
template <typename Pick>
layout::KvGeometry RandomGeometry(Pick& pick) {
  layout::KvGeometry geo;
  geo.num_layers = static_cast<uint32_t>(pick(1, 30));
  geo.num_kv_heads = static_cast<uint32_t>(pick(1, 4));
  geo.head_dim = 8 * static_cast<uint32_t>(pick(1, 8));
  geo.element_bytes = pick(0, 1) ? 2 : 4;
  geo.page_tokens = static_cast<uint32_t>(std::vector<uint64_t>{1, 3, 16, 64}[pick(0, 3)]);
  geo.layer_groups = static_cast<uint32_t>(pick(1, geo.num_layers));
  return geo;
}

// The daemon's figures against core's per-page Report, on random shapes and placements: the
// daemon counts whole pages by tier, so prompt boundaries and partial tails are where it can slip.
TEST(PlacementFiguresTest, AgreesWithCoreReportOnRandomPlacements) {
  std::mt19937_64 rng(20261129);
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const layout::KvGeometry geo = RandomGeometry(pick);
    const uint64_t length = pick(1, 3000);
    const uint64_t prompt = pick(0, length);
    tiering::Placement pl;
    pl.num_groups = geo.layer_groups;
    pl.num_pages = static_cast<uint32_t>(geo.NumPages(length));
    pl.tiers.resize(size_t{pl.num_groups} * pl.num_pages);
    const uint64_t skew = pick(0, 3);  // runs of one tier, or uniform noise
    for (auto& t : pl.tiers) t = static_cast<tiering::Tier>(pick(0, 3) == 0 ? skew : pick(0, 3));

    const PlacementFigures f = ComputeFigures(geo, pl, prompt, length);
    auto report = tiering::Report(pl, {.prompt_tokens = prompt, .length = length}, geo);
    ASSERT_TRUE(report.ok()) << report.status();
    std::array<uint64_t, tiering::kNumTiers> token_layers{};
    uint64_t t0_bytes = 0, full_bytes = 0;
    for (uint32_t g = 0; g < geo.layer_groups; ++g) {
      const uint64_t per_token = geo.PageBytes(g) / geo.page_tokens;
      const auto& tokens = report->group_tokens[g];
      for (int t = 0; t < tiering::kNumTiers; ++t) {
        token_layers[t] += tokens[t] * geo.LayersInGroup(g);
      }
      t0_bytes += tokens[0] * per_token;
      full_bytes += (tokens[0] + tokens[1] + tokens[2]) * per_token;
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " length " << length << " prompt "
                                      << prompt << " page_tokens " << geo.page_tokens);
    for (int t = 0; t < tiering::kNumTiers; ++t) {
      EXPECT_EQ(f.tokens[t], token_layers[t] / geo.num_layers) << "tier " << t;
    }
    EXPECT_EQ(f.t0_bytes, t0_bytes);
    EXPECT_EQ(f.full_bytes, full_bytes);
    EXPECT_DOUBLE_EQ(f.evicted_fraction_generated, report->evicted_generated_fraction);
    if (HasFailure()) break;
  }
}

// Growing the figures by positions written since the snapshot equals computing them over the
// placement grown by T0 pages (the tail page, in the recent window, is T0), on random shapes.
TEST(PlacementFiguresTest, GrowingEqualsRecomputingWithTheNewPositionsInT0) {
  std::mt19937_64 rng(20261206);
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const layout::KvGeometry geo = RandomGeometry(pick);
    const uint64_t from = pick(1, 2000);
    const uint64_t to = from + pick(1, 500);
    const uint64_t prompt = pick(0, from);
    tiering::Placement pl;
    pl.num_groups = geo.layer_groups;
    pl.num_pages = static_cast<uint32_t>(geo.NumPages(from));
    pl.tiers.resize(size_t{pl.num_groups} * pl.num_pages);
    for (auto& t : pl.tiers) t = static_cast<tiering::Tier>(pick(0, 3));
    tiering::Placement grown;
    grown.num_groups = pl.num_groups;
    grown.num_pages = static_cast<uint32_t>(geo.NumPages(to));
    grown.tiers.assign(size_t{grown.num_groups} * grown.num_pages, tiering::Tier::kT0);
    for (uint32_t g = 0; g < pl.num_groups; ++g) {
      pl.at(g, pl.num_pages - 1) = tiering::Tier::kT0;
      for (uint32_t p = 0; p < pl.num_pages; ++p) grown.at(g, p) = pl.at(g, p);
    }
    const PlacementFigures want = ComputeFigures(geo, grown, prompt, to);
    const PlacementFigures got =
        GrowFigures(geo, ComputeFigures(geo, pl, prompt, from), prompt, from, to);
    ASSERT_EQ(got.t0_bytes, want.t0_bytes) << "trial " << trial;
    ASSERT_EQ(got.full_bytes, want.full_bytes) << "trial " << trial;
    // Token counts are layer-weighted and floored per tier: the T0 count may differ by the
    // rounding of the original's.
    for (int t = 1; t < tiering::kNumTiers; ++t) ASSERT_EQ(got.tokens[t], want.tokens[t]);
    ASSERT_NEAR(static_cast<double>(got.tokens[0]), static_cast<double>(want.tokens[0]), 1.0);
    ASSERT_NEAR(got.evicted_fraction_generated, want.evicted_fraction_generated, 1e-9);
  }
}

}  // namespace
}  // namespace kvtier::daemon
