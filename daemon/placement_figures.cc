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
  for (uint32_t g = 0; g < pl.num_groups; ++g) {
    const uint64_t layers = geo.LayersInGroup(g);
    const uint64_t bytes_per_token = geo.PageBytes(g) / geo.page_tokens;
    for (uint32_t p = 0; p < pl.num_pages; ++p) {
      uint64_t b = geo.PageBegin(p);
      uint64_t e = std::min<uint64_t>(b + geo.page_tokens, length);
      if (e <= b) continue;
      uint64_t t = e - b;
      tiering::Tier tier = pl.at(g, p);
      token_layers[static_cast<int>(tier)] += t * layers;
      if (tier == tiering::Tier::kT0) f.t0_bytes += t * bytes_per_token;
      if (tier != tiering::Tier::kT3) f.full_bytes += t * bytes_per_token;
      if (tier == tiering::Tier::kT3) {
        uint64_t gb = std::max(b, prompt_tokens);
        if (e > gb) evicted_generated_layers += (e - gb) * layers;
      }
    }
  }
  for (int i = 0; i < tiering::kNumTiers; ++i) f.tokens[i] = token_layers[i] / geo.num_layers;
  if (length > prompt_tokens) {
    f.evicted_fraction_generated = static_cast<double>(evicted_generated_layers) /
                                   (static_cast<double>(length - prompt_tokens) * geo.num_layers);
  }
  return f;
}

}  // namespace kvtier::daemon
