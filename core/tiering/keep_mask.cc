#include "core/tiering/keep_mask.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvtier::tiering {

KeepMask KeepMask::AllKept(uint32_t num_layers, uint32_t num_kv_heads, uint64_t length) {
  KeepMask m{.num_layers = num_layers, .num_kv_heads = num_kv_heads, .length = length, .keep = {}};
  m.keep.assign(uint64_t{num_layers} * num_kv_heads * length, 1);
  return m;
}

uint64_t KeepMask::KeptCount(uint32_t layer, uint32_t kv_head) const {
  const auto begin = keep.begin() + static_cast<ptrdiff_t>(Index(layer, kv_head, 0));
  return static_cast<uint64_t>(std::count(begin, begin + static_cast<ptrdiff_t>(length), 1));
}

KeepMask KeepMask::Extended(uint64_t new_length) const {
  KeepMask m = AllKept(num_layers, num_kv_heads, std::max(new_length, length));
  for (uint64_t row = 0; row < uint64_t{num_layers} * num_kv_heads; ++row) {
    std::copy_n(keep.begin() + static_cast<ptrdiff_t>(row * length), length,
                m.keep.begin() + static_cast<ptrdiff_t>(row * m.length));
  }
  return m;
}

absl::Status KeepMask::Validate() const {
  const uint64_t expected = uint64_t{num_layers} * num_kv_heads * length;
  if (keep.size() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("keep mask has ", keep.size(),
                                                 " entries, expected num_layers × num_kv_heads"
                                                 " × length = ",
                                                 expected));
}

}  // namespace kvtier::tiering
