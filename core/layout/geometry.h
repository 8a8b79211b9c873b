#ifndef KVTIER_CORE_LAYOUT_GEOMETRY_H_
#define KVTIER_CORE_LAYOUT_GEOMETRY_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvtier::layout {

// The shape of one model's KV cache and how it is cut into pages. Plain value; thread-compatible.
//
// A page holds `page_tokens` consecutive positions of one layer group: for every layer of the
// group, K then V, each [page_tokens][num_kv_heads][head_dim] of `element_bytes` values.
struct KvGeometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t element_bytes = 4;  // 4 = f32 (CPU backend), 2 = f16/bf16 (CUDA)
  uint32_t page_tokens = 16;   // 1 = token-exact placement
  uint32_t layer_groups = 1;   // 1 = one placement for all layers (the paper)

  // INVALID_ARGUMENT naming the field when a value is zero or out of range.
  absl::Status Validate() const;

  // Values of one token's K (or V) in one layer.
  uint64_t ValuesPerTokenLayer() const { return uint64_t{num_kv_heads} * head_dim; }
  // Bytes of one token's K and V across all layers: what `full` keeps in HBM per token.
  uint64_t BytesPerToken() const { return 2 * ValuesPerTokenLayer() * element_bytes * num_layers; }
  // Layers in group g: [GroupBegin(g), GroupEnd(g)). Groups differ in size by at most one.
  uint32_t GroupBegin(uint32_t g) const { return g * num_layers / layer_groups; }
  uint32_t GroupEnd(uint32_t g) const { return (g + 1) * num_layers / layer_groups; }
  uint32_t GroupOfLayer(uint32_t layer) const;
  uint32_t LayersInGroup(uint32_t g) const { return GroupEnd(g) - GroupBegin(g); }
  // Full-precision bytes of one page of group g (K and V of every layer in the group).
  uint64_t PageBytes(uint32_t g) const {
    return 2 * uint64_t{page_tokens} * ValuesPerTokenLayer() * element_bytes * LayersInGroup(g);
  }
  // Pages needed for `tokens` positions (the last page may be partial).
  uint64_t NumPages(uint64_t tokens) const { return (tokens + page_tokens - 1) / page_tokens; }
  uint64_t PageOf(uint64_t position) const { return position / page_tokens; }
  uint64_t PageBegin(uint64_t page) const { return page * page_tokens; }
};

}  // namespace kvtier::layout

#endif  // KVTIER_CORE_LAYOUT_GEOMETRY_H_
