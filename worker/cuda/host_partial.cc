#include "worker/cuda/host_partial.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/kernels/cuda/dtype.h"

namespace kvtier::worker::cuda {
namespace {

using tiering::Tier;

KvLayout F32(KvLayout layout) {
  layout.geometry.element_bytes = 4;
  return layout;
}

}  // namespace

HostPartial::HostPartial(const KvLayout& layout, uint32_t num_q_heads, float scale)
    : layout_(layout),
      num_q_heads_(num_q_heads),
      scale_(scale),
      isa_(kernels::IsaUsable(kernels::BestIsa(), layout.geometry.head_dim)
               ? kernels::BestIsa()
               : kernels::Isa::kPortable),
      codec_({.layout = F32(layout), .num_q_heads = num_q_heads, .scale = scale}) {}

absl::Status HostPartial::LayerRows(const AttendCall& call, uint32_t page, const float** block) {
  const layout::KvGeometry& g = layout_.geometry;
  const StoredPage& e = call.pages[page];
  const uint32_t l = call.layer - g.GroupBegin(call.group);
  const uint64_t floats = layout_.LayerBlockFloats();
  if (e.tier == Tier::kT1 && g.element_bytes == 4) {  // in place, as the host backend reads it
    *block = reinterpret_cast<const float*>(call.ddr_base + e.slot) + layout_.LayerOffsetFloats(l);
    return absl::OkStatus();
  }
  if (e.tier == Tier::kT1) {  // bf16: this layer's block widened (exact)
    widened_.emplace_back(floats);
    const auto* bits =
        reinterpret_cast<const uint16_t*>(call.ddr_base + e.slot + layout_.LayerOffsetBytes(l));
    for (uint64_t i = 0; i < floats; ++i) {
      widened_.back()[i] = kernels::cuda::Bf16BitsToF32(bits[i]);
    }
    *block = widened_.back().data();
    return absl::OkStatus();
  }
  if (e.tier != Tier::kT2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page ", page, " of group ", call.group, " is in ", std::string(tiering::TierName(e.tier)),
        ": only T1/T2 pages are attended in place"));
  }
  Decoded& d = decoded_[uint64_t{call.group} << 32 | page];
  if (d.values.empty() || d.version != e.version) {
    d.values.resize(F32(layout_).geometry.PageBytes(call.group) / 4);
    RETURN_IF_ERROR(
        codec_.ReadPage(e, call.group, call.ddr_base, call.compressed_base, d.values.data()));
    if (g.element_bytes == 2) {  // what the device dequantizes into a bf16 block
      for (float& x : d.values) {
        x = kernels::cuda::Bf16BitsToF32(kernels::cuda::F32ToBf16Bits(x));
      }
    }
    d.version = e.version;
  }
  *block = d.values.data() + layout_.LayerOffsetFloats(l);
  return absl::OkStatus();
}

absl::Status HostPartial::Run(const AttendCall& call, const float* q,
                              const std::vector<uint8_t>& in_place, const HostPartialOut& out) {
  const layout::KvGeometry& g = layout_.geometry;
  const uint32_t length = call.length, pt = g.page_tokens;
  const uint64_t row = layout_.RowFloats();
  k_rows_.assign(length, nullptr);
  v_rows_.assign(length, nullptr);
  widened_.clear();
  widened_.reserve(in_place.size());  // pointers into it stay valid
  for (uint32_t page = 0; page * uint64_t{pt} < length; ++page) {
    if (page >= in_place.size() || in_place[page] == 0) continue;
    const float* block = nullptr;
    RETURN_IF_ERROR(LayerRows(call, page, &block));
    const uint32_t end = std::min<uint32_t>(length, (page + 1) * pt);
    for (uint32_t pos = page * pt; pos < end; ++pos) {
      k_rows_[pos] = block + uint64_t{pos % pt} * row;
      v_rows_[pos] = block + uint64_t{pt + pos % pt} * row;
    }
  }
  scratch_.resize(kernels::AttentionScratchFloats(num_q_heads_, length));
  kernels::AttentionParams p;
  p.q = q;
  p.out = out.out;
  p.lse = out.lse;
  p.head_mass = out.head_mass;
  p.k_rows = k_rows_.data();
  p.v_rows = v_rows_.data();
  p.length = length;
  p.num_queries = 1;
  p.num_q_heads = num_q_heads_;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.scale = scale_;
  p.scratch = scratch_.data();
  kernels::Attention(p, isa_);
  return absl::OkStatus();
}

}  // namespace kvtier::worker::cuda
