// libFuzzer target for the worker's and the client's checks of what the daemon sends: pool
// descriptors and sealed pool headers (client/lib/extent_mapping, core/layout/shm_abi), and
// plans applied to a tiered store (TieredKvStore::ApplyPlan's validation). The input is a
// script: descriptor and header bytes, then appends and plans with arbitrary moves and slot
// offsets. Invariants, besides no crash, no out-of-bounds access (ASan) and no undefined
// behaviour (UBSan):
//  - a descriptor is reserved only when its sizes agree, and a header validates only when every
//    checked field equals what registration said;
//  - a refused plan changes no page's tier; an applied one puts every moved page where it said;
//  - while no page has ever been compressed or evicted, attention over the store is
//    bit-identical to a store that never moved a page (every page kept exactly one valid copy;
//    a page compressed once and brought back holds its dequantized values, which is lossy by
//    design, so from then on only the tiers are checked).
//
// Built with -DKVTIER_FUZZ=ON (clang), and in the normal build as plan_fuzz_replay.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "client/lib/extent_mapping.h"
#include "core/layout/shm_abi.h"
#include "worker/device_arena.h"
#include "worker/page_pool.h"
#include "worker/tiered_kv_store.h"

namespace {

using kvtier::tiering::Tier;
namespace layout = kvtier::layout;
namespace worker = kvtier::worker;

// Plans applied (with at least one move) and exactness checks passed, for the replay test's
// fitness and its check that the search got past validation.
uint64_t applied_plans = 0, exact_checks = 0;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ >= end_; }
  uint8_t Byte() { return empty() ? 0 : *p_++; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | Byte();
    return v;
  }
  size_t Take(void* out, size_t n) {
    const size_t k = std::min<size_t>(n, static_cast<size_t>(end_ - p_));
    std::memcpy(out, p_, k);
    p_ += k;
    return k;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A descriptor as registration sends it, and the sealed header the worker maps.
void PoolChecks(Input& in) {
  kvtier::v1::PoolDescriptor d;
  d.set_kind(static_cast<kvtier::v1::PoolKind>(in.Byte() % 4));
  d.set_abi_version(in.Byte() % 2 == 0 ? layout::kPoolAbiVersion : in.Byte());
  const uint64_t extent = in.Byte() % 4 == 0 ? in.U64() : uint64_t{in.Byte()} << 12;
  const uint64_t count = in.Byte() % 4 == 0 ? in.U64() : in.Byte();
  d.set_extent_bytes(extent);
  d.set_max_extents(static_cast<uint32_t>(count));
  d.set_size_bytes(in.Byte() % 2 == 0 ? extent * d.max_extents() : in.U64());
  auto mapping = kvtier::internal::ExtentMapping::Reserve(d, /*worker_id=*/7, /*epoch=*/9);
  if (mapping.ok()) {
    if (d.extent_bytes() == 0 || d.extent_bytes() % 4096 != 0 || d.max_extents() == 0 ||
        d.size_bytes() != d.extent_bytes() * d.max_extents() ||
        (*mapping)->data_bytes() != d.size_bytes() || (*mapping)->mapped_extents() != 0) {
      std::abort();
    }
  }
  layout::PoolHeader h = layout::MakePoolHeader(layout::PoolKind::kDdr, 1 << 21, 16, 7, 9, 1);
  if (in.Byte() % 2 == 1) in.Take(&h, sizeof(h));
  const layout::PoolKind kind =
      in.Byte() % 2 ? layout::PoolKind::kDdr : layout::PoolKind::kCompressed;
  if (layout::ValidatePoolHeader(h, kind, 1 << 21, 16, 7).ok()) {
    if (h.magic != layout::kPoolMagic || h.abi_version != layout::kPoolAbiVersion ||
        h.kind != static_cast<uint32_t>(kind) || h.extent_bytes != (1 << 21) ||
        h.max_extents != 16 || h.worker_id != 7 || h.header_bytes != sizeof(h)) {
      std::abort();
    }
  }
}

struct Stores {
  static constexpr uint64_t kPoolBytes = 1 << 16;
  Stores() : arena(1 << 22), ref_arena(1 << 22) {
    ddr = *worker::HostPagePool::Create(worker::PoolKind::kDdr, kPoolBytes);
    compressed = *worker::HostPagePool::Create(worker::PoolKind::kCompressed, kPoolBytes);
    worker::TieredKvStoreOptions o;
    o.geometry.num_layers = 2;
    o.geometry.num_kv_heads = 1;
    o.geometry.head_dim = 16;
    o.geometry.element_bytes = 4;
    o.geometry.page_tokens = 4;
    o.geometry.layer_groups = 2;
    o.num_q_heads = 2;
    o.portable_kernel = true;
    test = *worker::TieredKvStore::Create(o, {&arena, ddr.get(), compressed.get()});
    ref = *worker::TieredKvStore::Create(o, {&ref_arena, nullptr, nullptr});
  }
  worker::HostArena arena, ref_arena;
  std::unique_ptr<worker::HostPagePool> ddr, compressed;
  std::unique_ptr<worker::TieredKvStore> test, ref;
};

void Append(Stores& s, Input& in) {
  const uint32_t n = 1 + in.Byte() % 6;
  std::vector<float> k(n * 16), v(n * 16);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(static_cast<int8_t>(in.Byte())) / 16.f;
    v[i] = static_cast<float>(i % 7) - 3.f;
  }
  // The tested store refuses to grow a T2/T3 page; the reference (which never moves a page)
  // mirrors whatever the tested store took.
  for (uint32_t layer = 0; layer < 2; ++layer) {
    if (!s.test->Append(layer, k.data(), v.data(), n).ok()) return;
    if (!s.ref->Append(layer, k.data(), v.data(), n).ok()) std::abort();
  }
}

bool OnlyFullPrecision(const kvtier::tiering::Placement& p) {
  for (Tier t : p.tiers) {
    if (t == Tier::kT2 || t == Tier::kT3) return false;
  }
  return true;
}

// Attention over every layer agrees bit for bit with the reference.
void CheckExact(Stores& s) {
  if (s.ref->Length(0) == 0 || s.test->Length(0) != s.ref->Length(0) ||
      s.test->Length(1) != s.ref->Length(1)) {
    return;
  }
  std::vector<float> q(2 * 16);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 5) - 2.f;
  std::vector<float> a(q.size()), b(q.size());
  for (uint32_t layer = 0; layer < 2; ++layer) {
    if (!s.test->Attend(layer, q.data(), 1, a.data(), nullptr).ok()) std::abort();
    if (!s.ref->Attend(layer, q.data(), 1, b.data(), nullptr).ok()) std::abort();
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) std::abort();
  }
  ++exact_checks;
}

void Plan(Stores& s, Input& in) {
  const uint32_t n = in.Byte() % 9;
  std::vector<kvtier::tiering::Move> moves(n);
  std::vector<worker::SlotAssignment> slots(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t b = in.Byte();
    moves[i] = {static_cast<uint32_t>(b % 3), static_cast<uint32_t>(in.Byte() % 12),
                static_cast<Tier>((b >> 2) % 4), static_cast<Tier>((b >> 4) % 4)};
    const uint8_t o = in.Byte();
    slots[i].dst_offset = o == 0xFF ? in.U64() : uint64_t{o} * 256;
  }
  const kvtier::tiering::Placement before = s.test->placement();
  if (!s.test->ApplyPlan(moves, slots).ok()) {
    if (s.test->placement().tiers != before.tiers) std::abort();  // refused: nothing moved
    return;
  }
  const kvtier::tiering::Placement after = s.test->placement();
  for (const auto& m : moves) {
    if (after.at(m.group, m.page) != m.to) std::abort();
  }
  applied_plans += n > 0;
}

}  // namespace

extern "C" void KvtierPlanFuzzCounts(uint64_t out[2]) {
  out[0] = applied_plans;
  out[1] = exact_checks;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  PoolChecks(in);
  Stores s;
  bool lossless = true;  // no page was ever compressed or evicted
  for (int op = 0; op < 64 && !in.empty(); ++op) {
    if (in.Byte() % 3 == 0) {
      Append(s, in);
    } else {
      Plan(s, in);
    }
    lossless = lossless && OnlyFullPrecision(s.test->placement());
    if (lossless) CheckExact(s);
  }
  return 0;
}
