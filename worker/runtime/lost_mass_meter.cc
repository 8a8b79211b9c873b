#include "worker/runtime/lost_mass_meter.h"

#include <cmath>

#include "worker/codecs/codec.h"
#include "worker/kv_backend.h"

namespace kvtier::worker {
namespace {

uint64_t PageFloats(const layout::KvGeometry& g, uint32_t group) {
  return g.PageBytes(group) / g.element_bytes;
}

}  // namespace

void LostMassMeter::MeasureCompression(const TieredKvStore& store,
                                       const std::vector<tiering::Move>& moves) {
  const KvLayout layout{store.geometry(), &store.codec()};
  const codecs::Codec& codec = store.codec();
  const uint32_t rows = layout.geometry.page_tokens;
  const auto cols = static_cast<uint32_t>(layout.RowFloats());
  const uint64_t half = layout.LayerBlockFloats() / 2;  // K, then V
  for (const tiering::Move& m : moves) {
    if (m.to != tiering::Tier::kT2) continue;
    page_.resize(PageFloats(layout.geometry, m.group));
    if (!store.ReadPage(m.group, m.page, page_.data()).ok()) continue;
    decoded_.resize(half);
    double diff = 0, norm = 0;
    for (uint32_t l = 0; l < layout.geometry.LayersInGroup(m.group); ++l) {
      for (auto role : {codecs::TensorRole::kKey, codecs::TensorRole::kValue}) {
        const float* x = page_.data() + layout.LayerOffsetFloats(l) +
                         (role == codecs::TensorRole::kKey ? 0 : half);
        encoded_.resize(codec.encoded_bytes(role, rows, cols));
        codec.encode(role, x, rows, cols, encoded_.data());
        codec.decode(role, encoded_.data(), rows, cols, decoded_.data());
        for (uint64_t i = 0; i < half; ++i) {
          const double d = double{decoded_[i]} - x[i];
          diff += d * d;
          norm += double{x[i]} * x[i];
        }
      }
    }
    SetError(m.group, m.page, norm > 0 ? static_cast<float>(std::sqrt(diff / norm)) : 0.f);
  }
}

void LostMassMeter::SetError(uint32_t group, uint32_t page, float error) {
  if (page_errors_.size() <= group) page_errors_.resize(group + 1);
  std::vector<float>& errors = page_errors_[group];
  if (errors.size() <= page) errors.resize(page + 1, 0.f);
  errors[page] = error;
}

float LostMassMeter::PageError(uint32_t group, uint32_t page) const {
  if (group >= page_errors_.size() || page >= page_errors_[group].size()) return 0.f;
  return page_errors_[group][page];
}

tiering::LostMass LostMassMeter::Measure(absl::Span<const float> page_scores,
                                         const tiering::Placement& placement,
                                         const layout::KvGeometry& geometry, uint64_t length,
                                         uint64_t steps) {
  tiering::LostMass total;
  const uint32_t groups = placement.num_groups;
  if (groups == 0 || page_scores.size() % groups != 0) return total;
  const size_t pages = page_scores.size() / groups;
  last_scores_.resize(groups);
  page_errors_.resize(std::max<size_t>(page_errors_.size(), groups));
  for (uint32_t g = 0; g < groups; ++g) {
    absl::Span<const float> scores = page_scores.subspan(g * pages, pages);
    absl::Span<const tiering::Tier> tiers =
        absl::MakeConstSpan(placement.tiers)
            .subspan(size_t{g} * placement.num_pages, placement.num_pages);
    std::vector<float> gained(scores.begin(), scores.end());
    for (size_t p = 0; p < gained.size() && p < last_scores_[g].size(); ++p) {
      gained[p] -= last_scores_[g][p];
    }
    const double weight =
        static_cast<double>(geometry.LayersInGroup(g)) / static_cast<double>(geometry.num_layers);
    total.compressed += weight * tiering::CompressedLostMass(gained, tiers, page_errors_[g], steps);
    total.evicted +=
        weight * tiering::EvictedMassEstimate(scores, tiers, geometry.page_tokens, length);
    last_scores_[g].assign(scores.begin(), scores.end());
  }
  return total;
}

}  // namespace kvtier::worker
