#include "core/layout/geometry.h"

#include "absl/strings/str_cat.h"

namespace kvtier::layout {
namespace {

absl::Status RequirePositive(const char* field, uint32_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be positive, got ", value));
}

}  // namespace

absl::Status KvGeometry::Validate() const {
  for (auto [field, value] :
       {std::pair{"num_layers", num_layers}, std::pair{"num_kv_heads", num_kv_heads},
        std::pair{"head_dim", head_dim}, std::pair{"page_tokens", page_tokens},
        std::pair{"layer_groups", layer_groups}}) {
    if (auto s = RequirePositive(field, value); !s.ok()) return s;
  }
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("element_bytes must be 1, 2 or 4, got ", element_bytes));
  }
  if (layer_groups > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_groups (", layer_groups, ") must not exceed num_layers (", num_layers, ")"));
  }
  return absl::OkStatus();
}

uint32_t KvGeometry::GroupOfLayer(uint32_t layer) const {
  // Inverse of GroupBegin: the largest g with g * L / G <= layer.
  uint32_t g =
      static_cast<uint32_t>((uint64_t{layer} * layer_groups + layer_groups - 1) / num_layers);
  while (g > 0 && GroupBegin(g) > layer) --g;
  while (g + 1 < layer_groups && GroupBegin(g + 1) <= layer) ++g;
  return g;
}

}  // namespace kvtier::layout
