#ifndef KVTIER_WORKER_RUNTIME_LOST_MASS_METER_H_
#define KVTIER_WORKER_RUNTIME_LOST_MASS_METER_H_

// The quality guardrail of one sequence (core/tiering/lost_mass.h): measures each page's codec
// error before a plan compresses it, and at every re-tiering the attention mass the interval just
// ended could not serve exactly. Not thread-safe: the sequence's decode loop drives it.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tiering/lost_mass.h"
#include "core/tiering/types.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {

class LostMassMeter {
 public:
  // Before a plan runs: the codec error of each page `moves` compresses, ‖x − x̂‖ / ‖x‖ over its
  // K and V in every layer of its group, from a copy of the page encoded and decoded with the
  // store's codec (what the plan will encode; O(1 page) of scratch, reused). A page that cannot
  // be read keeps its previous error.
  void MeasureCompression(const TieredKvStore& store, const std::vector<tiering::Move>& moves);

  // The interval since the last call: `page_scores` are every group's cumulative page scores
  // (group-major, as the snapshot carries them), `placement` the tiers in force over the
  // interval, `steps` the decode steps it spanned. Groups are weighted by their share of layers.
  tiering::LostMass Measure(absl::Span<const float> page_scores,
                            const tiering::Placement& placement, const layout::KvGeometry& geometry,
                            uint64_t length, uint64_t steps);

  // The codec error measured for a page (0 when never compressed).
  float PageError(uint32_t group, uint32_t page) const;

 private:
  void SetError(uint32_t group, uint32_t page, float error);

  std::vector<float> page_, decoded_;  // scratch
  std::vector<uint8_t> encoded_;
  std::vector<std::vector<float>> page_errors_;  // [group][page]
  std::vector<std::vector<float>> last_scores_;  // [group][page] at the last Measure
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_LOST_MASS_METER_H_
