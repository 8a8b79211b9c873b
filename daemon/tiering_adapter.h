#ifndef KVTIER_DAEMON_TIERING_ADAPTER_H_
#define KVTIER_DAEMON_TIERING_ADAPTER_H_

// The one place where the daemon calls the tiering library (core/tiering): policy validation,
// the target placement of a snapshot, and the ordered moves between two placements. Everything
// else in daemon/ goes through these functions, so a change of the tiering API changes only
// tiering_adapter.cc.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tiering/policy.h"
#include "core/tiering/types.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// A validated PolicyConfig with defaults applied. Plain value.
struct PolicySpec {
  std::string name;
  double hbm_ratio = 1.0;
  double evict_ratio = 0.0;
  double compress_ratio = 0.0;
  uint32_t sink_tokens = 4;
  uint32_t window_tokens = 128;
  bool protect_prompt = true;
  bool page_score_max = false;
  double max_lost_mass = std::numeric_limits<double>::infinity();  // ε; inf = no limit
  uint32_t page_tokens = 16;                                       // from the worker's geometry
  std::shared_ptr<const tiering::Policy> impl;  // immutable; Decide is thread-safe
};

// Checks name and ratios; INVALID_ARGUMENT naming "policy.<field>" and the value. Policies that
// need worker-side state (h2o, rkv, arkv) are refused here.
absl::StatusOr<PolicySpec> ValidatePolicy(const v1::PolicyConfig& config, uint32_t page_tokens);

// Whether the policy may place pages in T2 (so the daemon may compress instead of offloading
// when the DDR pool is short).
bool AllowsCompression(const PolicySpec& policy);

// The placement the policy wants for a snapshot. `current` is the acknowledged placement
// (num_groups x num_pages, new tail pages T0); `scores` is group-major, same size, finite.
// Guarantees: pages in T3 stay in T3; protected pages are T0; the target has current's shape.
struct Decision {
  tiering::Placement target;
  bool protected_overflow = false;  // protected pages alone exceed the T0 budget
};
// `sequence`: its prompt, length and first protected prompt position (OpenSequenceRequest's).
absl::StatusOr<Decision> DecidePlacement(const PolicySpec& policy,
                                         const tiering::SequenceState& sequence,
                                         const tiering::Placement& current,
                                         absl::Span<const float> scores);

// Moves from `current` to `target` in execution order (core/tiering's MakePlan): evictions,
// offloads, compressions, decompressions, promotions; every demotion before every promotion.
absl::StatusOr<std::vector<tiering::Move>> OrderedMoves(const tiering::Placement& current,
                                                        const tiering::Placement& target);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_TIERING_ADAPTER_H_
