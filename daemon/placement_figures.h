#ifndef KVTIER_DAEMON_PLACEMENT_FIGURES_H_
#define KVTIER_DAEMON_PLACEMENT_FIGURES_H_

// The figures of one sequence's placement (PlacementReport on the wire). Pure functions.

#include <array>
#include <cstdint>

#include "core/layout/geometry.h"
#include "core/tiering/types.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// Plain value. Token counts are layer-weighted: a position counts in tier X for the share of
// layers whose group places it in X (with one group, exactly the positions).
struct PlacementFigures {
  std::array<uint64_t, tiering::kNumTiers> tokens{};
  uint64_t t0_bytes = 0;
  uint64_t full_bytes = 0;  // live (non-evicted) positions, all in T0
  double evicted_fraction_generated = 0.0;

  void ToProto(v1::PlacementReport* out) const;
};

PlacementFigures ComputeFigures(const layout::KvGeometry& geometry,
                                const tiering::Placement& placement, uint64_t prompt_tokens,
                                uint64_t length);

// The figures `f` of a placement over `from` positions once the sequence holds `to` (> from):
// the positions past `from` are in T0, where a snapshot's new pages at the tail are. What status
// shows between re-tierings, when a heartbeat or the open said how long a sequence is.
PlacementFigures GrowFigures(const layout::KvGeometry& geometry, PlacementFigures f,
                             uint64_t prompt_tokens, uint64_t from, uint64_t to);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PLACEMENT_FIGURES_H_
