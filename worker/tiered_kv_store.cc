#include "worker/tiered_kv_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "worker/host_kv_backend.h"

namespace kvtier::worker {
namespace {

std::string TierStr(tiering::Tier t) { return std::string(tiering::TierName(t)); }

using tiering::Tier;

constexpr uint64_t kCompressedBlockAlignment = 16;

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

absl::Status ValidateOptions(const TieredKvStoreOptions& o, const StoreMemory& m,
                             const KvBackend& backend) {
  RETURN_IF_ERROR(o.geometry.Validate());
  if (!backend.StoresElementBytes(o.geometry.element_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry.element_bytes must be 4 (f32)",
                     backend.StoresElementBytes(2) ? " or 2 (bf16)" : "", " on this backend, got ",
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
  if (m.arena->host_accessible() != backend.host_t0()) {
    return absl::InvalidArgumentError(absl::StrCat("memory.arena must ",
                                                   backend.host_t0() ? "" : "not ",
                                                   "be host-accessible on this backend"));
  }
  if (o.keep_mask && !backend.host_t0()) {
    return absl::InvalidArgumentError("keep_mask is supported on the host backend only");
  }
  if (m.ddr_pool != nullptr && m.ddr_pool->kind() != PoolKind::kDdr) {
    return absl::InvalidArgumentError("memory.ddr_pool must be a pool of kind kDdr");
  }
  if (m.compressed_pool != nullptr && m.compressed_pool->kind() != PoolKind::kCompressed) {
    return absl::InvalidArgumentError("memory.compressed_pool must be a pool of kind kCompressed");
  }
  return absl::OkStatus();
}

// Host memory of a pool, or null without one.
const uint8_t* BaseOf(const PagePool* pool) { return pool != nullptr ? pool->base() : nullptr; }

}  // namespace

uint64_t KvLayout::ReservedBlockBytes(codecs::TensorRole role) const {
  return AlignUp(codec->encoded_bytes(role, geometry.page_tokens,
                                      static_cast<uint32_t>(geometry.ValuesPerTokenLayer())),
                 kCompressedBlockAlignment);
}

uint64_t KvLayout::CompressedBlockOffset(uint32_t layer_in_group, codecs::TensorRole role) const {
  const uint64_t kb = ReservedBlockBytes(codecs::TensorRole::kKey);
  const uint64_t vb = ReservedBlockBytes(codecs::TensorRole::kValue);
  return uint64_t{layer_in_group} * (kb + vb) + (role == codecs::TensorRole::kKey ? 0 : kb);
}

uint64_t KvLayout::CompressedSlotBytes(uint32_t group) const {
  return uint64_t{geometry.LayersInGroup(group)} * (ReservedBlockBytes(codecs::TensorRole::kKey) +
                                                    ReservedBlockBytes(codecs::TensorRole::kValue));
}

uint64_t DdrSlotBytes(const layout::KvGeometry& geometry, uint32_t group) {
  return geometry.PageBytes(group);
}

uint64_t CompressedSlotBytes(const codecs::Codec& codec, const layout::KvGeometry& geometry,
                             uint32_t group) {
  return KvLayout{geometry, &codec}.CompressedSlotBytes(group);
}

float AttentionScale(const TieredKvStoreOptions& options) {
  return options.scale > 0.f ? options.scale
                             : 1.f / std::sqrt(static_cast<float>(options.geometry.head_dim));
}

absl::StatusOr<std::unique_ptr<TieredKvStore>> TieredKvStore::Create(
    const TieredKvStoreOptions& options, const StoreMemory& memory) {
  RETURN_IF_ERROR(options.geometry.Validate());
  ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(options.codec));
  return Create(options, memory,
                std::make_unique<HostKvBackend>(
                    HostKvBackendOptions{.layout = {options.geometry, codec},
                                         .num_q_heads = options.num_q_heads,
                                         .scale = AttentionScale(options),
                                         .max_staged_pages = options.max_staged_pages,
                                         .portable_kernel = options.portable_kernel}));
}

absl::StatusOr<std::unique_ptr<TieredKvStore>> TieredKvStore::Create(
    const TieredKvStoreOptions& options, const StoreMemory& memory,
    std::unique_ptr<KvBackend> backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend must not be null");
  RETURN_IF_ERROR(ValidateOptions(options, memory, *backend));
  ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(options.codec));
  RETURN_IF_ERROR(backend->BindPools(memory.ddr_pool, memory.compressed_pool));
  return std::unique_ptr<TieredKvStore>(
      new TieredKvStore(options, memory, codec, std::move(backend)));
}

TieredKvStore::TieredKvStore(const TieredKvStoreOptions& options, const StoreMemory& memory,
                             const codecs::Codec* codec, std::unique_ptr<KvBackend> backend)
    : geometry_(options.geometry),
      num_q_heads_(options.num_q_heads),
      keep_mask_(options.keep_mask),
      memory_(memory),
      codec_(codec),
      layout_{options.geometry, codec},
      backend_(std::move(backend)),
      row_floats_(options.geometry.ValuesPerTokenLayer()),
      lengths_(options.geometry.num_layers, 0),
      pages_(options.geometry.layer_groups) {
  if (keep_mask_) keep_.resize(size_t{geometry_.num_layers} * geometry_.num_kv_heads);
}

TieredKvStore::~TieredKvStore() {
  // Copies still reading T0 blocks or slots land before the memory goes back.
  (void)backend_->Drain();
  PollFence();
  for (uint32_t g = 0; g < pages_.size(); ++g) {
    for (PageEntry& e : pages_[g]) {
      if (e.tier == Tier::kT0) FreeBlock(e.t0, geometry_.PageBytes(g));
    }
  }
}

void TieredKvStore::PollFence() {
  if (fence_.held_blocks() == 0 && fence_.held_slots() == 0) return;
  fence_.Poll([this](CopyToken t) { return backend_->Completed(t); },
              [this](uint8_t* block, uint64_t bytes) { FreeBlock(block, bytes); });
}

absl::StatusOr<uint8_t*> TieredKvStore::AllocateBlock(uint64_t bytes) {
  PollFence();
  absl::StatusOr<uint8_t*> block = memory_.arena->Allocate(bytes);
  if (block.ok() || fence_.held_blocks() == 0) return block;
  // Blocks given up by this store's demotions come back once their copies land.
  RETURN_IF_ERROR(backend_->Wait(fence_.BlocksToken()));
  PollFence();
  return memory_.arena->Allocate(bytes);
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
  RETURN_IF_ERROR(backend_->BindPools(ddr_pool, compressed_pool));
  memory_.ddr_pool = ddr_pool;
  memory_.compressed_pool = compressed_pool;
  return absl::OkStatus();
}

PagePool* TieredKvStore::PoolOf(Tier tier) const {
  return tier == Tier::kT1   ? memory_.ddr_pool
         : tier == Tier::kT2 ? memory_.compressed_pool
                             : nullptr;
}

uint8_t* TieredKvStore::PageBytes(uint32_t group, uint32_t page) const {
  const PageEntry& e = pages_[group][page];
  if (e.tier == Tier::kT0) return e.t0;
  if (e.tier == Tier::kT1) return memory_.ddr_pool->base() + e.slot;
  return nullptr;
}

absl::Status TieredKvStore::EnsurePages(uint32_t group, uint64_t pages) {
  std::vector<PageEntry>& entries = pages_[group];
  const size_t before = entries.size();
  absl::Status s;
  while (s.ok() && entries.size() < pages) {
    absl::StatusOr<uint8_t*> block = AllocateBlock(geometry_.PageBytes(group));
    if (!block.ok()) {
      s = block.status();
      break;
    }
    entries.push_back(PageEntry{.tier = Tier::kT0, .t0 = *block, .version = new_page_version_});
    s = backend_->ClearBlock(*block, geometry_.PageBytes(group));  // unwritten rows read as 0
  }
  if (!s.ok()) {
    for (size_t i = before; i < entries.size(); ++i) {
      FreeBlock(entries[i].t0, geometry_.PageBytes(group));
    }
    entries.resize(before);
  }
  return s;
}

absl::Status TieredKvStore::Append(uint32_t layer, const float* k, const float* v, uint32_t n) {
  return Append(layer, k, RowStrides{}, v, RowStrides{}, n);
}

absl::Status TieredKvStore::Append(uint32_t layer, const float* k, RowStrides k_strides,
                                   const float* v, RowStrides v_strides, uint32_t n) {
  const bool dense = k_strides.dense() && v_strides.dense();
  if (!dense && !backend_->host_t0()) {
    return absl::UnimplementedError("strided K/V rows are read by the host backend only");
  }
  // One side strided, the other dense: the dense one's strides spelled out ({0, 0} is a marker).
  const RowStrides dense_strides{row_floats_, geometry_.head_dim};
  if (k_strides.dense()) k_strides = dense_strides;
  if (v_strides.dense()) v_strides = dense_strides;
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
    const bool writable = t == Tier::kT0 || (t == Tier::kT1 && backend_->host_t0());
    if (!writable) {
      return absl::FailedPreconditionError(absl::StrCat(
          "page ", p, " of group ", group, " is in ", TierStr(t), "; appends need it in ",
          backend_->host_t0() ? "T0 or T1" : "T0 on this backend"));
    }
  }
  RETURN_IF_ERROR(EnsurePages(group, end_pages));
  const uint32_t pt = geometry_.page_tokens;
  const uint64_t layer_off = layout_.LayerOffsetBytes(layer - geometry_.GroupBegin(group));
  const uint64_t row_bytes = layout_.RowBytes();
  // One write per page touched: rows of one page are contiguous in its K and its V block.
  for (uint32_t i = 0; i < n;) {
    const uint32_t pos = begin + i;
    const uint32_t rows = std::min(n - i, pt - pos % pt);
    PageEntry& entry = pages_[group][pos / pt];
    uint8_t* base = PageBytes(group, pos / pt) + layer_off;
    uint8_t* k_dst = base + uint64_t{pos % pt} * row_bytes;
    uint8_t* v_dst = base + (uint64_t{pt} + pos % pt) * row_bytes;
    RETURN_IF_ERROR(dense ? backend_->WriteRows(k_dst, v_dst, k + i * row_floats_,
                                                v + i * row_floats_, rows, row_floats_)
                          : backend_->WriteStridedRows(k_dst, v_dst, k + i * k_strides.token,
                                                       k_strides, v + i * v_strides.token,
                                                       v_strides, rows, geometry_.num_kv_heads,
                                                       geometry_.head_dim));
    entry.version += rows;
    i += rows;
  }
  lengths_[layer] = begin + n;
  if (keep_mask_) {
    for (uint32_t h = 0; h < geometry_.num_kv_heads; ++h) {
      keep_[size_t{layer} * geometry_.num_kv_heads + h].resize(lengths_[layer], 1);
    }
  }
  return absl::OkStatus();
}

absl::Status TieredKvStore::Truncate(uint32_t length, std::vector<ReleasedSlot>* released) {
  const uint32_t now = lengths_.empty() ? 0 : lengths_[0];
  for (uint32_t layer = 1; layer < lengths_.size(); ++layer) {
    if (lengths_[layer] != now) {
      return absl::FailedPreconditionError(
          absl::StrCat("layers differ in length (layer 0 has ", now, ", layer ", layer, " has ",
                       lengths_[layer], "): truncate between forward passes"));
    }
  }
  if (length > now) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", length, " exceeds the sequence's ", now));
  }
  if (length == now) return absl::OkStatus();
  const uint32_t pt = geometry_.page_tokens;
  const uint64_t keep_pages = geometry_.NumPages(length);
  if (length % pt != 0) {
    const uint64_t page = length / pt;
    for (uint32_t g = 0; g < pages_.size(); ++g) {
      if (page >= pages_[g].size()) continue;
      const Tier t = pages_[g][page].tier;
      if (t == Tier::kT0 || (t == Tier::kT1 && backend_->host_t0())) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "length ", length, " keeps part of page ", page, " of group ", g, ", which is in ",
          TierStr(t),
          t == Tier::kT3 ? ": its rows were evicted; truncate to a multiple of page_tokens ("
                         : ": promote it to T0 first, or truncate to a multiple of page_tokens (",
          pt, ")"));
    }
  }
  // Copies may still read the blocks and slots given up below.
  RETURN_IF_ERROR(backend_->Drain());
  PollFence();
  for (uint32_t g = 0; g < pages_.size(); ++g) {
    std::vector<PageEntry>& entries = pages_[g];
    for (uint64_t p = keep_pages; p < entries.size(); ++p) {
      PageEntry& e = entries[p];
      new_page_version_ = std::max(new_page_version_, e.version + 1);
      if (e.tier == Tier::kT0) FreeBlock(e.t0, geometry_.PageBytes(g));
      if (e.tier == Tier::kT1 || e.tier == Tier::kT2) {
        const PoolKind kind = e.tier == Tier::kT1 ? PoolKind::kDdr : PoolKind::kCompressed;
        held_[e.tier == Tier::kT1 ? 0 : 1].erase(e.slot);
        if (released != nullptr) released->push_back({kind, e.slot});
      }
    }
    if (entries.size() > keep_pages) entries.resize(keep_pages);
    // The kept partial page's rows past the end are rewritten by the next append.
    if (length % pt != 0 && keep_pages > 0 && keep_pages <= entries.size()) {
      entries[keep_pages - 1].version += 1;
    }
  }
  for (uint32_t& l : lengths_) l = length;
  if (keep_mask_) {
    for (auto& rows : keep_) rows.resize(std::min<size_t>(rows.size(), length));
  }
  in_place_.clear();
  return backend_->FollowSchedule({}, pages_);  // the schedule named pages that may be gone
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

absl::Status TieredKvStore::PrepareAttend(uint32_t layer, const float* q, uint32_t n, float* out,
                                          float* position_mass, AttendCall* call) {
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
  if (position_mass != nullptr && backend_->device_scores()) {
    return absl::InvalidArgumentError(
        "position_mass must be null on this backend: it accumulates the scores itself");
  }
  const uint32_t group = geometry_.GroupOfLayer(layer);
  if (keep_mask_) {
    keep_rows_.clear();
    for (uint32_t h = 0; h < geometry_.num_kv_heads; ++h) {
      keep_rows_.push_back(keep_[size_t{layer} * geometry_.num_kv_heads + h].data());
    }
  }
  *call = AttendCall{};
  call->layer = layer;
  call->group = group;
  call->q = q;
  call->n = n;
  call->out = out;
  call->position_mass = position_mass;
  call->length = length;
  call->pages = pages_[group].data();
  if (!in_place_.empty()) {
    call->in_place = in_place_[group].data();
    call->in_place_pages = static_cast<uint32_t>(in_place_[group].size());
  }
  call->split = n == 1 && SplitsAt(group, length);
  call->keep = keep_mask_ ? keep_rows_.data() : nullptr;
  call->ddr_base = BaseOf(memory_.ddr_pool);
  call->compressed_base = BaseOf(memory_.compressed_pool);
  return absl::OkStatus();
}

absl::Status TieredKvStore::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                   float* position_mass) {
  return Attend(layer, q, n, out, position_mass, AttendMask{});
}

absl::Status TieredKvStore::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                   float* position_mass, const AttendMask& mask,
                                   RowStrides q_strides) {
  if ((mask.window != 0 || mask.softcap != 0.f) && !backend_->host_t0()) {
    return absl::UnimplementedError(
        absl::StrCat("a sliding window (", mask.window, ") or softcap (", mask.softcap,
                     ") is computed by the host backend only, not on a device"));
  }
  if (!q_strides.dense() && !backend_->host_t0()) {
    return absl::UnimplementedError("strided queries are read by the host backend only");
  }
  if (!(mask.softcap >= 0.f) || std::isinf(mask.softcap)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softcap ", mask.softcap, " must be finite and >= 0 (0 = none)"));
  }
  AttendCall call;
  RETURN_IF_ERROR(PrepareAttend(layer, q, n, out, position_mass, &call));
  call.mask = mask;
  call.q_strides = q_strides;
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(backend_->Attend(call, stats_));
  stats_.attend_nanos += NanosSince(start);
  return absl::OkStatus();
}

absl::Status TieredKvStore::AttendBatch(const std::vector<TieredKvStore*>& stores, uint32_t layer,
                                        const float* q, float* out,
                                        const std::vector<float*>& position_mass) {
  if (stores.empty()) return absl::InvalidArgumentError("stores must not be empty");
  if (!position_mass.empty() && position_mass.size() != stores.size()) {
    return absl::InvalidArgumentError(absl::StrCat("position_mass.size() (", position_mass.size(),
                                                   ") must be 0 or stores.size() (", stores.size(),
                                                   ")"));
  }
  for (size_t i = 0; i < stores.size(); ++i) {
    auto at = [i] { return absl::StrCat("stores[", i, "]"); };
    const TieredKvStore* s = stores[i];
    if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat(at(), " is null"));
    if (std::find(stores.begin(), stores.begin() + i, s) != stores.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(at(), " is listed twice"));
    }
    const layout::KvGeometry& a = stores[0]->geometry_;
    const layout::KvGeometry& b = s->geometry_;
    if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads ||
        a.head_dim != b.head_dim || a.page_tokens != b.page_tokens ||
        a.layer_groups != b.layer_groups || a.element_bytes != b.element_bytes ||
        stores[0]->num_q_heads_ != s->num_q_heads_) {
      return absl::InvalidArgumentError(absl::StrCat(at(), " has another geometry than stores[0]"));
    }
    const KvBackend& ba = *stores[0]->backend_;
    const KvBackend& bb = *s->backend_;
    if (typeid(ba) != typeid(bb)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), " runs on another backend than stores[0]"));
    }
  }
  const uint64_t q_row = uint64_t{stores[0]->geometry_.head_dim} * stores[0]->num_q_heads_;
  std::vector<AttendCall> calls(stores.size());
  std::vector<KvBackend*> backends(stores.size());
  std::vector<StoreStats*> stats(stores.size());
  for (size_t i = 0; i < stores.size(); ++i) {
    float* mass = position_mass.empty() ? nullptr : position_mass[i];
    absl::Status s =
        stores[i]->PrepareAttend(layer, q + i * q_row, 1, out + i * q_row, mass, &calls[i]);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("stores[", i, "]: ", s.message()));
    backends[i] = stores[i]->backend_.get();
    stats[i] = &stores[i]->stats_;
  }
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(backends[0]->AttendBatch(backends, calls, stats));
  const uint64_t share = NanosSince(start) / stores.size();
  for (TieredKvStore* s : stores) s->stats_.attend_nanos += share;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> TieredKvStore::TakeDeviceScores() {
  if (!backend_->device_scores()) {
    return absl::FailedPreconditionError(
        "this backend keeps no scores: they come through Attend's position_mass");
  }
  std::vector<std::vector<float>> scores(geometry_.layer_groups);
  RETURN_IF_ERROR(backend_->TakeScores(Length(0), &scores));
  return scores;
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
  return backend_->ReadPage(e, group, BaseOf(memory_.ddr_pool), BaseOf(memory_.compressed_pool),
                            dst);
}

}  // namespace kvtier::worker
