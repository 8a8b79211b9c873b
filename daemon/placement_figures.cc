#include "daemon/placement_figures.h"

#include <algorithm>

namespace kvtier::daemon {

void PlacementFigures::ToProto(v1::PlacementReport* out) const {
  out->set_tokens_t0(tokens[0]);
  out->set_tokens_t1(tokens[1]);
  out->set_tokens_t2(tokens[2]);
  out->set_tokens_t3(tokens[3]);
  out->set_evicted_fraction_generated(evicted_fraction_generated);
  out->set_t0_bytes(t0_bytes);
  out->set_full_bytes(full_bytes);
}

PlacementFigures ComputeFigures(const layout::KvGeometry& geo, const tiering::Placement& pl,
                                uint64_t prompt_tokens, uint64_t length) {
  PlacementFigures f;
  // Sums of tokens x layers, divided by num_layers at the end.
  std::array<uint64_t, tiering::kNumTiers> token_layers{};
  uint64_t evicted_generated_layers = 0;
  const uint64_t pt = geo.page_tokens;
  // Runs every snapshot over every page, so whole pages are only counted by tier; the few
  // pages that are partial (the tail) or straddle the end of the prompt go one by one.
  const uint64_t whole = std::min<uint64_t>(pl.num_pages, length / pt);
  const uint64_t prompt_pages = std::min(whole, prompt_tokens / pt);  // all-prompt pages
  const uint64_t generated_from = std::min(whole, (prompt_tokens + pt - 1) / pt);
  for (uint32_t g = 0; g < pl.num_groups; ++g) {
    const uint64_t layers = geo.LayersInGroup(g);
    const uint64_t bytes_per_token = geo.PageBytes(g) / pt;
    const auto add = [&](tiering::Tier tier, uint64_t tokens, uint64_t generated) {
      token_layers[static_cast<int>(tier)] += tokens * layers;
      if (tier == tiering::Tier::kT0) f.t0_bytes += tokens * bytes_per_token;
      if (tier != tiering::Tier::kT3) f.full_bytes += tokens * bytes_per_token;
      if (tier == tiering::Tier::kT3) evicted_generated_layers += generated * layers;
    };
    const auto one_page = [&](uint64_t p) {
      const uint64_t b = geo.PageBegin(p), e = std::min<uint64_t>(b + pt, length);
      if (e <= b) return;
      add(pl.at(g, static_cast<uint32_t>(p)), e - b,
          e > std::max(b, prompt_tokens) ? e - std::max(b, prompt_tokens) : 0);
    };
    const tiering::Tier* row = pl.tiers.data() + size_t{g} * pl.num_pages;
    std::array<uint64_t, tiering::kNumTiers> prompt_count{}, generated_count{};
    for (uint64_t p = 0; p < prompt_pages; ++p) ++prompt_count[static_cast<uint8_t>(row[p])];
    for (uint64_t p = prompt_pages; p < generated_from; ++p) one_page(p);
    for (uint64_t p = generated_from; p < whole; ++p) {
      ++generated_count[static_cast<uint8_t>(row[p])];
    }
    for (uint64_t p = whole; p < pl.num_pages; ++p) one_page(p);
    for (int t = 0; t < tiering::kNumTiers; ++t) {
      add(static_cast<tiering::Tier>(t), prompt_count[t] * pt, 0);
      add(static_cast<tiering::Tier>(t), generated_count[t] * pt, generated_count[t] * pt);
    }
  }
  for (int i = 0; i < tiering::kNumTiers; ++i) f.tokens[i] = token_layers[i] / geo.num_layers;
  if (length > prompt_tokens) {
    f.evicted_fraction_generated = static_cast<double>(evicted_generated_layers) /
                                   (static_cast<double>(length - prompt_tokens) * geo.num_layers);
  }
  return f;
}

PlacementFigures GrowFigures(const layout::KvGeometry& geo, PlacementFigures f,
                             uint64_t prompt_tokens, uint64_t from, uint64_t to) {
  if (to <= from) return f;
  const uint64_t added = to - from;
  f.tokens[0] += added;
  f.t0_bytes += added * geo.BytesPerToken();
  f.full_bytes += added * geo.BytesPerToken();
  // The evicted generated positions stay as many; the generated ones grow.
  const uint64_t generated_before = from > prompt_tokens ? from - prompt_tokens : 0;
  if (to > prompt_tokens) {
    f.evicted_fraction_generated *=
        static_cast<double>(generated_before) / static_cast<double>(to - prompt_tokens);
  }
  return f;
}

}  // namespace kvtier::daemon
