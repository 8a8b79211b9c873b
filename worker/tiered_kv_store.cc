#include "worker/tiered_kv_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"

namespace kvtier::worker {
namespace {

std::string TierStr(tiering::Tier t) { return std::string(tiering::TierName(t)); }

using tiering::Tier;

constexpr uint64_t kCompressedBlockAlignment = 16;

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
uint64_t PageKey(uint32_t group, uint32_t page) { return uint64_t{group} << 32 | page; }

uint64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

// Bytes of one encoded K or V block reserved in a compressed page (page_tokens rows).
uint64_t ReservedBlockBytes(const codecs::Codec& codec, const layout::KvGeometry& g,
                            codecs::TensorRole role) {
  return AlignUp(
      codec.encoded_bytes(role, g.page_tokens, static_cast<uint32_t>(g.ValuesPerTokenLayer())),
      kCompressedBlockAlignment);
}

absl::Status ValidateOptions(const TieredKvStoreOptions& o, const StoreMemory& m) {
  RETURN_IF_ERROR(o.geometry.Validate());
  if (o.geometry.element_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.element_bytes must be 4 (f32) on the CPU backend, got ",
                     o.geometry.element_bytes));
  }
  if (o.num_q_heads == 0 || o.num_q_heads % o.geometry.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads (", o.num_q_heads,
                                                   ") must be a positive multiple of "
                                                   "geometry.num_kv_heads (",
                                                   o.geometry.num_kv_heads, ")"));
  }
  if (!std::isfinite(o.scale) || o.scale < 0.f) {
    return absl::InvalidArgumentError(absl::StrCat("scale must be finite and >= 0, got ", o.scale));
  }
  if (m.arena == nullptr) return absl::InvalidArgumentError("memory.arena must not be null");
  if (!m.arena->host_accessible()) {
    return absl::InvalidArgumentError("memory.arena must be host-accessible on the CPU backend");
  }
  if (m.ddr_pool != nullptr && m.ddr_pool->kind() != PoolKind::kDdr) {
    return absl::InvalidArgumentError("memory.ddr_pool must be a pool of kind kDdr");
  }
  if (m.compressed_pool != nullptr && m.compressed_pool->kind() != PoolKind::kCompressed) {
    return absl::InvalidArgumentError("memory.compressed_pool must be a pool of kind kCompressed");
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t DdrSlotBytes(const layout::KvGeometry& geometry, uint32_t group) {
  return geometry.PageBytes(group);
}

uint64_t CompressedSlotBytes(const codecs::Codec& codec, const layout::KvGeometry& geometry,
                             uint32_t group) {
  return uint64_t{geometry.LayersInGroup(group)} *
         (ReservedBlockBytes(codec, geometry, codecs::TensorRole::kKey) +
          ReservedBlockBytes(codec, geometry, codecs::TensorRole::kValue));
}

absl::StatusOr<std::unique_ptr<TieredKvStore>> TieredKvStore::Create(
    const TieredKvStoreOptions& options, const StoreMemory& memory) {
  RETURN_IF_ERROR(ValidateOptions(options, memory));
  ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(options.codec));
  return std::unique_ptr<TieredKvStore>(new TieredKvStore(options, memory, codec));
}

TieredKvStore::TieredKvStore(const TieredKvStoreOptions& options, const StoreMemory& memory,
                             const codecs::Codec* codec)
    : geometry_(options.geometry),
      num_q_heads_(options.num_q_heads),
      scale_(options.scale > 0.f ? options.scale
                                 : 1.f / std::sqrt(static_cast<float>(options.geometry.head_dim))),
      keep_mask_(options.keep_mask),
      max_staged_pages_(options.max_staged_pages),
      isa_(options.portable_kernel ||
                   !kernels::IsaUsable(kernels::BestIsa(), options.geometry.head_dim)
               ? kernels::Isa::kPortable
               : kernels::BestIsa()),
      memory_(memory),
      codec_(codec),
      row_floats_(options.geometry.ValuesPerTokenLayer()),
      lengths_(options.geometry.num_layers, 0),
      pages_(options.geometry.layer_groups) {
  if (keep_mask_) keep_.resize(size_t{geometry_.num_layers} * geometry_.num_kv_heads);
}

TieredKvStore::~TieredKvStore() {
  for (uint32_t g = 0; g < pages_.size(); ++g) {
    for (PageEntry& e : pages_[g]) {
      if (e.tier == Tier::kT0) memory_.arena->Free(e.t0, geometry_.PageBytes(g));
    }
  }
}

uint32_t TieredKvStore::Length(uint32_t layer) const {
  return layer < lengths_.size() ? lengths_[layer] : 0;
}

uint32_t TieredKvStore::num_pages() const {
  uint32_t n = 0;
  for (const auto& g : pages_) n = std::max<uint32_t>(n, static_cast<uint32_t>(g.size()));
  return n;
}

absl::Status TieredKvStore::RebindPools(PagePool* ddr_pool, PagePool* compressed_pool) {
  if (!held_[0].empty() || !held_[1].empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rebind pools: ", held_[0].size(),
                                                      " pages in T1 and ", held_[1].size(),
                                                      " in T2 still live in the old ones"));
  }
  memory_.ddr_pool = ddr_pool;
  memory_.compressed_pool = compressed_pool;
  return absl::OkStatus();
}

PagePool* TieredKvStore::PoolOf(Tier tier) const {
  return tier == Tier::kT1   ? memory_.ddr_pool
         : tier == Tier::kT2 ? memory_.compressed_pool
                             : nullptr;
}

float* TieredKvStore::PageFloats(uint32_t group, uint32_t page) const {
  const PageEntry& e = pages_[group][page];
  if (e.tier == Tier::kT0) return reinterpret_cast<float*>(e.t0);
  if (e.tier == Tier::kT1) return reinterpret_cast<float*>(memory_.ddr_pool->base() + e.slot);
  return nullptr;
}

absl::Status TieredKvStore::EnsurePages(uint32_t group, uint64_t pages) {
  std::vector<PageEntry>& entries = pages_[group];
  const size_t before = entries.size();
  while (entries.size() < pages) {
    auto block = memory_.arena->Allocate(geometry_.PageBytes(group));
    if (!block.ok()) {
      for (size_t i = before; i < entries.size(); ++i) {
        memory_.arena->Free(entries[i].t0, geometry_.PageBytes(group));
      }
      entries.resize(before);
      return block.status();
    }
    std::memset(*block, 0, geometry_.PageBytes(group));  // unwritten rows read as zeros
    entries.push_back(PageEntry{.tier = Tier::kT0, .t0 = *block});
  }
  return absl::OkStatus();
}

absl::Status TieredKvStore::Append(uint32_t layer, const float* k, const float* v, uint32_t n) {
  if (layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " out of range [0, ", geometry_.num_layers, ")"));
  }
  if (n == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr) return absl::InvalidArgumentError("k and v must not be null");
  const uint32_t group = geometry_.GroupOfLayer(layer);
  const uint32_t begin = lengths_[layer];
  const uint64_t first_page = geometry_.PageOf(begin);
  const uint64_t end_pages = geometry_.NumPages(uint64_t{begin} + n);
  for (uint64_t p = first_page; p < std::min<uint64_t>(end_pages, pages_[group].size()); ++p) {
    const Tier t = pages_[group][p].tier;
    if (t == Tier::kT2 || t == Tier::kT3) {
      return absl::FailedPreconditionError(absl::StrCat(
          "page ", p, " of group ", group, " is in ", TierStr(t), "; appends need it in T0 or T1"));
    }
  }
  RETURN_IF_ERROR(EnsurePages(group, end_pages));
  const uint32_t pt = geometry_.page_tokens;
  const uint64_t layer_off = uint64_t{layer - geometry_.GroupBegin(group)} * 2 * pt * row_floats_;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t pos = begin + i;
    PageEntry& entry = pages_[group][pos / pt];
    float* base = PageFloats(group, pos / pt) + layer_off;
    std::memcpy(base + uint64_t{pos % pt} * row_floats_, k + i * row_floats_, row_floats_ * 4);
    std::memcpy(base + (uint64_t{pt} + pos % pt) * row_floats_, v + i * row_floats_,
                row_floats_ * 4);
    ++entry.version;
  }
  lengths_[layer] = begin + n;
  if (keep_mask_) {
    for (uint32_t h = 0; h < geometry_.num_kv_heads; ++h) {
      keep_[size_t{layer} * geometry_.num_kv_heads + h].resize(lengths_[layer], 1);
    }
  }
  return absl::OkStatus();
}

absl::Status TieredKvStore::SetKeep(uint32_t layer, uint32_t kv_head, uint32_t position,
                                    bool keep) {
  if (!keep_mask_) return absl::FailedPreconditionError("keep_mask is not enabled");
  if (layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (kv_head >= geometry_.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat("kv_head ", kv_head, " out of range"));
  }
  if (position >= lengths_[layer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("position ", position, " out of range [0, ", lengths_[layer], ")"));
  }
  keep_[size_t{layer} * geometry_.num_kv_heads + kv_head][position] = keep ? 1 : 0;
  return absl::OkStatus();
}

uint64_t TieredKvStore::CompressedBlockOffset(uint32_t group, uint32_t layer_in_group,
                                              codecs::TensorRole role) const {
  const uint64_t kb = ReservedBlockBytes(*codec_, geometry_, codecs::TensorRole::kKey);
  const uint64_t vb = ReservedBlockBytes(*codec_, geometry_, codecs::TensorRole::kValue);
  return uint64_t{layer_in_group} * (kb + vb) + (role == codecs::TensorRole::kKey ? 0 : kb);
}

void TieredKvStore::EncodePage(uint32_t group, const float* src, uint32_t rows,
                               uint8_t* dst) const {
  const uint32_t cols = static_cast<uint32_t>(row_floats_);
  const uint64_t block = uint64_t{geometry_.page_tokens} * row_floats_;
  for (uint32_t l = 0; l < geometry_.LayersInGroup(group); ++l) {
    const float* layer_src = src + 2 * block * l;
    codec_->encode(codecs::TensorRole::kKey, layer_src, rows, cols,
                   dst + CompressedBlockOffset(group, l, codecs::TensorRole::kKey));
    codec_->encode(codecs::TensorRole::kValue, layer_src + block, rows, cols,
                   dst + CompressedBlockOffset(group, l, codecs::TensorRole::kValue));
  }
}

void TieredKvStore::DecodeLayer(uint32_t group, uint32_t l, const uint8_t* src, uint32_t rows,
                                float* dst) const {
  const uint32_t cols = static_cast<uint32_t>(row_floats_);
  const uint64_t block = uint64_t{geometry_.page_tokens} * row_floats_;
  float* layer_dst = dst + 2 * block * l;
  // Rows past `rows` were never written: keep them zero like a fresh T0 page.
  std::fill(layer_dst, layer_dst + 2 * block, 0.f);
  codec_->decode(codecs::TensorRole::kKey,
                 src + CompressedBlockOffset(group, l, codecs::TensorRole::kKey), rows, cols,
                 layer_dst);
  codec_->decode(codecs::TensorRole::kValue,
                 src + CompressedBlockOffset(group, l, codecs::TensorRole::kValue), rows, cols,
                 layer_dst + block);
}

void TieredKvStore::DecodePage(uint32_t group, const uint8_t* src, uint32_t rows,
                               float* dst) const {
  for (uint32_t l = 0; l < geometry_.LayersInGroup(group); ++l) {
    DecodeLayer(group, l, src, rows, dst);
  }
}

const float* TieredKvStore::StagedLayer(uint32_t group, uint32_t page, uint32_t layer) {
  const PageEntry& e = pages_[group][page];
  Staged& s = staged_[PageKey(group, page)];
  if (s.data.empty() || s.version != e.version) {
    s.data.assign(PageFloatsCount(group), 0.f);
    s.layer_ready.assign(geometry_.LayersInGroup(group), 0);
    s.version = e.version;
  }
  s.last_use = ++use_clock_;
  const uint32_t l = layer - geometry_.GroupBegin(group);
  if (s.layer_ready[l]) {
    ++stats_.t2_layers_reused;
  } else {
    DecodeLayer(group, l, memory_.compressed_pool->base() + e.slot, e.compressed_rows,
                s.data.data());
    s.layer_ready[l] = 1;
    ++stats_.t2_layers_dequantized;
  }
  return s.data.data();
}

void TieredKvStore::TrimStaging() {
  if (max_staged_pages_ == 0) return;
  while (staged_.size() > max_staged_pages_) {
    auto oldest = staged_.begin();
    for (auto it = staged_.begin(); it != staged_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    staged_.erase(oldest);
  }
}

void TieredKvStore::DropStaged(uint32_t group, uint32_t page) {
  staged_.erase(PageKey(group, page));
}

absl::Status TieredKvStore::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                   float* position_mass) {
  if (layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " out of range [0, ", geometry_.num_layers, ")"));
  }
  const uint32_t length = lengths_[layer];
  if (n == 0 || n > length) {
    return absl::InvalidArgumentError(
        absl::StrCat("n (", n, ") must be in [1, Length(layer) = ", length, "]"));
  }
  if (q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("q and out must not be null");
  }
  const auto start = std::chrono::steady_clock::now();
  const uint32_t group = geometry_.GroupOfLayer(layer);
  const uint32_t pt = geometry_.page_tokens;
  const uint64_t layer_off = uint64_t{layer - geometry_.GroupBegin(group)} * 2 * pt * row_floats_;
  k_rows_.resize(length);
  v_rows_.resize(length);
  for (uint32_t page = 0; page * uint64_t{pt} < length; ++page) {
    const Tier tier = pages_[group][page].tier;
    const float* base = tier == Tier::kT3   ? nullptr
                        : tier == Tier::kT2 ? StagedLayer(group, page, layer)
                                            : PageFloats(group, page);
    const uint32_t end = std::min<uint32_t>(length, (page + 1) * pt);
    for (uint32_t pos = page * pt; pos < end; ++pos) {
      const bool live = base != nullptr;
      k_rows_[pos] = live ? base + layer_off + uint64_t{pos % pt} * row_floats_ : nullptr;
      v_rows_[pos] = live ? base + layer_off + uint64_t{pt + pos % pt} * row_floats_ : nullptr;
    }
  }
  std::vector<const uint8_t*> keep;
  if (keep_mask_) {
    for (uint32_t h = 0; h < geometry_.num_kv_heads; ++h) {
      keep.push_back(keep_[size_t{layer} * geometry_.num_kv_heads + h].data());
    }
  }
  scratch_.resize(kernels::AttentionScratchFloats(num_q_heads_, length));
  kernels::AttentionParams p;
  p.q = q;
  p.out = out;
  p.position_mass = position_mass;
  p.k_rows = k_rows_.data();
  p.v_rows = v_rows_.data();
  p.keep = keep_mask_ ? keep.data() : nullptr;
  p.length = length;
  p.num_queries = n;
  p.num_q_heads = num_q_heads_;
  p.num_kv_heads = geometry_.num_kv_heads;
  p.head_dim = geometry_.head_dim;
  p.scale = scale_;
  p.scratch = scratch_.data();
  p.runner = runner_;
  if (n == 1 && SplitsAt(group, length)) {
    AttendSplit(p, group);
  } else {
    kernels::Attention(p, isa_);
  }
  TrimStaging();
  stats_.attend_nanos += NanosSince(start);
  return absl::OkStatus();
}

Tier TieredKvStore::TierOf(uint32_t group, uint32_t page) const { return pages_[group][page].tier; }

bool TieredKvStore::IsLossy(uint32_t group, uint32_t page) const {
  return pages_[group][page].lossy;
}

tiering::Placement TieredKvStore::placement() const {
  tiering::Placement out;
  out.num_groups = geometry_.layer_groups;
  out.num_pages = num_pages();
  out.tiers.assign(size_t{out.num_groups} * out.num_pages, Tier::kT0);
  for (uint32_t g = 0; g < pages_.size(); ++g) {
    for (uint32_t p = 0; p < pages_[g].size(); ++p) out.at(g, p) = pages_[g][p].tier;
  }
  return out;
}

uint64_t TieredKvStore::SlotBytes(PoolKind kind, uint32_t group) const {
  return kind == PoolKind::kDdr ? DdrSlotBytes(geometry_, group)
                                : CompressedSlotBytes(*codec_, geometry_, group);
}

std::vector<ReleasedSlot> TieredKvStore::HeldSlots() const {
  std::vector<ReleasedSlot> out;
  for (const auto& group : pages_) {
    for (const PageEntry& e : group) {
      if (e.tier == Tier::kT1) out.push_back({PoolKind::kDdr, e.slot});
      if (e.tier == Tier::kT2) out.push_back({PoolKind::kCompressed, e.slot});
    }
  }
  return out;
}

absl::Status TieredKvStore::ReadPage(uint32_t group, uint32_t page, float* dst) const {
  if (group >= pages_.size() || page >= pages_[group].size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page (group ", group, ", page ", page, ") does not exist"));
  }
  const PageEntry& e = pages_[group][page];
  if (e.tier == Tier::kT3) {
    return absl::FailedPreconditionError(
        absl::StrCat("page ", page, " of group ", group, " is evicted"));
  }
  if (e.tier == Tier::kT2) {
    DecodePage(group, memory_.compressed_pool->base() + e.slot, e.compressed_rows, dst);
  } else {
    std::memcpy(dst, PageFloats(group, page), geometry_.PageBytes(group));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::worker
