#ifndef KVTIER_CORE_TIERING_KEEP_MASK_H_
#define KVTIER_CORE_TIERING_KEEP_MASK_H_

// Per-(layer, kv head, position) keep decision: the output of the worker-side eviction
// baselines (h2o, rkv). The worker's attention honours it: a position not kept for (layer,
// kv head) is evicted there (T3) for good. Plain value; thread-compatible.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::tiering {

struct KeepMask {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint64_t length = 0;  // positions [0, length)
  // keep[(layer * num_kv_heads + kv_head) * length + position]: 1 = kept, 0 = evicted.
  std::vector<uint8_t> keep;

  // Every position kept.
  static KeepMask AllKept(uint32_t num_layers, uint32_t num_kv_heads, uint64_t length);

  uint64_t Index(uint32_t layer, uint32_t kv_head, uint64_t position) const {
    return (uint64_t{layer} * num_kv_heads + kv_head) * length + position;
  }
  bool Kept(uint32_t layer, uint32_t kv_head, uint64_t position) const {
    return keep[Index(layer, kv_head, position)] != 0;
  }
  uint64_t KeptCount(uint32_t layer, uint32_t kv_head) const;
  // The same mask over `new_length` >= length positions; the new positions are kept.
  KeepMask Extended(uint64_t new_length) const;
  // INVALID_ARGUMENT when keep.size() != num_layers × num_kv_heads × length.
  absl::Status Validate() const;

  friend bool operator==(const KeepMask&, const KeepMask&) = default;
};

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_KEEP_MASK_H_
