#include "daemon/placement_figures.h"

#include <gtest/gtest.h>

#include <random>

#include "core/tiering/plan.h"

namespace kvtier::daemon {
namespace {

// The daemon's figures against core's per-page Report, on random shapes and placements: the
// daemon counts whole pages by tier, so prompt boundaries and partial tails are where it can slip.
TEST(PlacementFiguresTest, AgreesWithCoreReportOnRandomPlacements) {
  std::mt19937_64 rng(20261129);
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 3000; ++trial) {
    layout::KvGeometry geo;
    geo.num_layers = static_cast<uint32_t>(pick(1, 30));
    geo.num_kv_heads = static_cast<uint32_t>(pick(1, 4));
    geo.head_dim = 8 * static_cast<uint32_t>(pick(1, 8));
    geo.element_bytes = pick(0, 1) ? 2 : 4;
    geo.page_tokens = static_cast<uint32_t>(std::vector<uint64_t>{1, 3, 16, 64}[pick(0, 3)]);
    geo.layer_groups = static_cast<uint32_t>(pick(1, geo.num_layers));
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

}  // namespace
}  // namespace kvtier::daemon
