#include "worker/host_kv_backend.h"

#include <algorithm>
#include <cstring>

#include "worker/kernels/attention_merge.h"
#include "worker/kernels/copy_cpu.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {
namespace {

using tiering::Tier;

uint64_t PageKey(uint32_t group, uint32_t page) { return uint64_t{group} << 32 | page; }

}  // namespace

HostKvBackend::HostKvBackend(const HostKvBackendOptions& options)
    : layout_(options.layout),
      num_q_heads_(options.num_q_heads),
      scale_(options.scale),
      max_staged_pages_(options.max_staged_pages),
      isa_(options.portable_kernel ||
                   !kernels::IsaUsable(kernels::BestIsa(), options.layout.geometry.head_dim)
               ? kernels::Isa::kPortable
               : kernels::BestIsa()) {}

absl::Status HostKvBackend::ClearBlock(uint8_t* block, uint64_t bytes) {
  std::memset(block, 0, bytes);
  return absl::OkStatus();
}

absl::Status HostKvBackend::WriteRows(uint8_t* k_dst, uint8_t* v_dst, const float* k,
                                      const float* v, uint32_t rows, uint64_t row_floats) {
  std::memcpy(k_dst, k, rows * row_floats * 4);
  std::memcpy(v_dst, v, rows * row_floats * 4);
  return absl::OkStatus();
}

absl::Status HostKvBackend::WriteStridedRows(uint8_t* k_dst, uint8_t* v_dst, const float* k,
                                             RowStrides k_strides, const float* v,
                                             RowStrides v_strides, uint32_t rows, uint32_t heads,
                                             uint32_t head_dim) {
  auto gather = [&](uint8_t* dst_bytes, const float* src, RowStrides strides) {
    float* dst = reinterpret_cast<float*>(dst_bytes);
    for (uint32_t t = 0; t < rows; ++t) {
      for (uint32_t h = 0; h < heads; ++h, dst += head_dim) {
        std::memcpy(dst, src + t * strides.token + h * strides.head, head_dim * sizeof(float));
      }
    }
  };
  gather(k_dst, k, k_strides);
  gather(v_dst, v, v_strides);
  return absl::OkStatus();
}

absl::Status HostKvBackend::CopyPage(Tier /*from*/, const uint8_t* src, Tier /*to*/, uint8_t* dst,
                                     uint64_t bytes) {
  kernels::CopyPage(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostKvBackend::EncodePage(Tier /*from*/, const uint8_t* src_bytes, uint32_t group,
                                       uint32_t rows, uint8_t* dst) {
  const float* src = reinterpret_cast<const float*>(src_bytes);
  const uint32_t cols = static_cast<uint32_t>(layout_.RowFloats());
  const uint64_t block = layout_.LayerBlockFloats() / 2;
  for (uint32_t l = 0; l < layout_.geometry.LayersInGroup(group); ++l) {
    const float* layer_src = src + layout_.LayerOffsetFloats(l);
    layout_.codec->encode(codecs::TensorRole::kKey, layer_src, rows, cols,
                          dst + layout_.CompressedBlockOffset(l, codecs::TensorRole::kKey));
    layout_.codec->encode(codecs::TensorRole::kValue, layer_src + block, rows, cols,
                          dst + layout_.CompressedBlockOffset(l, codecs::TensorRole::kValue));
  }
  return absl::OkStatus();
}

void HostKvBackend::DecodeLayer(uint32_t /*group*/, uint32_t l, const uint8_t* src, uint32_t rows,
                                float* dst) const {
  const uint32_t cols = static_cast<uint32_t>(layout_.RowFloats());
  const uint64_t block = layout_.LayerBlockFloats() / 2;
  float* layer_dst = dst + layout_.LayerOffsetFloats(l);
  // Rows past `rows` were never written: keep them zero like a fresh T0 page.
  std::fill(layer_dst, layer_dst + 2 * block, 0.f);
  layout_.codec->decode(codecs::TensorRole::kKey,
                        src + layout_.CompressedBlockOffset(l, codecs::TensorRole::kKey), rows,
                        cols, layer_dst);
  layout_.codec->decode(codecs::TensorRole::kValue,
                        src + layout_.CompressedBlockOffset(l, codecs::TensorRole::kValue), rows,
                        cols, layer_dst + block);
}

absl::Status HostKvBackend::DecodePage(const uint8_t* src, uint32_t group, uint32_t rows,
                                       Tier /*to*/, uint8_t* dst) {
  for (uint32_t l = 0; l < layout_.geometry.LayersInGroup(group); ++l) {
    DecodeLayer(group, l, src, rows, reinterpret_cast<float*>(dst));
  }
  return absl::OkStatus();
}

absl::Status HostKvBackend::ReadPage(const StoredPage& page, uint32_t group,
                                     const uint8_t* ddr_base, const uint8_t* compressed_base,
                                     float* dst) {
  if (page.tier == Tier::kT2) {
    return DecodePage(compressed_base + page.slot, group, page.compressed_rows, Tier::kT0,
                      reinterpret_cast<uint8_t*>(dst));
  }
  const uint8_t* src = page.tier == Tier::kT0 ? page.t0 : ddr_base + page.slot;
  std::memcpy(dst, src, layout_.geometry.PageBytes(group));
  return absl::OkStatus();
}

const float* HostKvBackend::StagedLayer(const AttendCall& call, uint32_t page, StoreStats& stats) {
  const StoredPage& e = call.pages[page];
  Staged& s = staged_[PageKey(call.group, page)];
  if (s.data.empty() || s.version != e.version) {
    s.data.assign(layout_.geometry.PageBytes(call.group) / 4, 0.f);
    s.layer_ready.assign(layout_.geometry.LayersInGroup(call.group), 0);
    s.version = e.version;
  }
  s.last_use = ++use_clock_;
  const uint32_t l = call.layer - layout_.geometry.GroupBegin(call.group);
  if (s.layer_ready[l]) {
    ++stats.t2_layers_reused;
  } else {
    DecodeLayer(call.group, l, call.compressed_base + e.slot, e.compressed_rows, s.data.data());
    s.layer_ready[l] = 1;
    ++stats.t2_layers_dequantized;
  }
  return s.data.data();
}

void HostKvBackend::TrimStaging() {
  if (max_staged_pages_ == 0) return;
  while (staged_.size() > max_staged_pages_) {
    auto oldest = staged_.begin();
    for (auto it = staged_.begin(); it != staged_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    staged_.erase(oldest);
  }
}

void HostKvBackend::Forget(uint32_t group, uint32_t page) { staged_.erase(PageKey(group, page)); }

absl::Status HostKvBackend::Attend(const AttendCall& call, StoreStats& stats) {
  const layout::KvGeometry& g = layout_.geometry;
  const uint32_t length = call.length;
  const uint32_t pt = g.page_tokens;
  const uint64_t row_floats = layout_.RowFloats();
  const uint64_t layer_off = layout_.LayerOffsetFloats(call.layer - g.GroupBegin(call.group));
  k_rows_.resize(length);
  v_rows_.resize(length);
  for (uint32_t page = 0; page * uint64_t{pt} < length; ++page) {
    const StoredPage& e = call.pages[page];
    const float* base = e.tier == Tier::kT3   ? nullptr
                        : e.tier == Tier::kT2 ? StagedLayer(call, page, stats)
                        : e.tier == Tier::kT0
                            ? reinterpret_cast<const float*>(e.t0)
                            : reinterpret_cast<const float*>(call.ddr_base + e.slot);
    const uint32_t end = std::min<uint32_t>(length, (page + 1) * pt);
    for (uint32_t pos = page * pt; pos < end; ++pos) {
      const bool live = base != nullptr;
      k_rows_[pos] = live ? base + layer_off + uint64_t{pos % pt} * row_floats : nullptr;
      v_rows_[pos] = live ? base + layer_off + uint64_t{pt + pos % pt} * row_floats : nullptr;
    }
  }
  scratch_.resize(kernels::AttentionScratchFloats(num_q_heads_, length));
  kernels::AttentionParams p;
  p.q = call.q;
  p.q_token_stride = call.q_strides.token;
  p.q_head_stride = call.q_strides.head;
  p.out = call.out;
  p.position_mass = call.position_mass;
  p.k_rows = k_rows_.data();
  p.v_rows = v_rows_.data();
  p.keep = call.keep;
  p.length = length;
  p.num_queries = call.n;
  p.num_q_heads = num_q_heads_;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.scale = scale_;
  p.window = call.mask.window;
  p.softcap = call.mask.softcap;
  p.scratch = scratch_.data();
  p.runner = runner_;
  if (call.n == 1 && call.split) {
    AttendSplit(p, call);
    ++stats.split_attends;
  } else {
    kernels::Attention(p, isa_);
  }
  TrimStaging();
  return absl::OkStatus();
}

void HostKvBackend::AttendSplit(const kernels::AttentionParams& p, const AttendCall& call) {
  // Part 0: every page but those in place (what the device would attend); part 1: those in
  // place (the CPU's partial over DDR). Each sees the whole length, the other's rows null.
  const uint32_t pt = layout_.geometry.page_tokens;
  for (int part = 0; part < 2; ++part) {
    split_k_[part].assign(p.k_rows, p.k_rows + p.length);
    split_v_[part].assign(p.v_rows, p.v_rows + p.length);
  }
  for (uint32_t page = 0; page * uint64_t{pt} < p.length; ++page) {
    const bool in_place = AttendedInPlace(call.pages[page], call.InPlaceMark(page));
    const int other = in_place ? 0 : 1;  // the part that does not read this page
    const uint32_t end = std::min<uint32_t>(p.length, (page + 1) * pt);
    for (uint32_t pos = page * pt; pos < end; ++pos)
      split_k_[other][pos] = split_v_[other][pos] = nullptr;
  }
  const size_t out_floats = size_t{p.num_q_heads} * p.head_dim;
  kernels::AttentionPartial parts[2];
  for (int part = 0; part < 2; ++part) {
    part_out_[part].resize(out_floats);
    part_lse_[part].resize(p.num_q_heads);
    part_mass_[part].resize(size_t{p.num_q_heads} * p.length);
    kernels::AttentionParams q = p;
    q.out = part_out_[part].data();
    q.position_mass = nullptr;
    q.lse = part_lse_[part].data();
    q.head_mass = part_mass_[part].data();
    q.k_rows = split_k_[part].data();
    q.v_rows = split_v_[part].data();
    kernels::Attention(q, isa_);
    parts[part] = {part_out_[part].data(), part_lse_[part].data(), part_mass_[part].data()};
  }
  kernels::MergeAttentionPartials(parts, {1, p.num_q_heads, p.head_dim, p.length}, p.out,
                                  /*lse=*/nullptr, p.position_mass);
}

}  // namespace kvtier::worker
