// ApplyPlan: validation (nothing changes on a bad plan) and randomized plan sequences whose
// page bytes are checked against a model of what was written.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/store_rig.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {
namespace {

using ::kvtier::tiering::Move;
using ::kvtier::tiering::Tier;
using ::kvtier::worker::testing::RandomVector;
using ::kvtier::worker::testing::Rig;
using ::kvtier::worker::testing::SmolLmGeometry;
using ::testing::HasSubstr;

// Snapshot of everything observable about a store, to prove a rejected plan changed nothing.
struct Snapshot {
  tiering::Placement placement;
  std::vector<std::vector<float>> pages;  // empty for evicted pages
  std::vector<ReleasedSlot> held;
  uint64_t arena_used;

  static Snapshot Of(const TieredKvStore& s, const Rig& rig) {
    Snapshot out{s.placement(), {}, s.HeldSlots(), rig.arena->used_bytes()};
    for (uint32_t g = 0; g < s.geometry().layer_groups; ++g) {
      for (uint32_t p = 0; p < s.num_pages(); ++p) {
        std::vector<float> page(DdrSlotBytes(s.geometry(), g) / 4);
        if (!s.ReadPage(g, p, page.data()).ok()) page.clear();
        out.pages.push_back(std::move(page));
      }
    }
    return out;
  }
  bool operator==(const Snapshot& o) const {
    return placement == o.placement && pages == o.pages && held == o.held &&
           arena_used == o.arena_used;
  }
};

class PlanValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TieredKvStoreOptions o;
    o.geometry = SmolLmGeometry(4, 2);
    o.geometry.num_layers = 2;
    o.num_q_heads = 9;
    store_ = rig_.MakeStore(o);
    std::mt19937 rng(1);
    testing::AppendRandom(rng, *store_, 18);  // pages 0..4, page 4 partial (2 tokens)
    // Page 0 of group 0 in T1, page 1 of group 0 in T2, page 2 of group 1 evicted.
    ASSERT_TRUE(store_
                    ->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1},
                                      {0, 1, Tier::kT0, Tier::kT2},
                                      {1, 2, Tier::kT0, Tier::kT3}},
                                     *rig_.slots)
                    .ok());
    held_ddr_ = store_->HeldSlots()[0].offset;
  }

  // Applies and expects `code` with `field` in the message and no change at all.
  void ExpectRejected(const std::vector<Move>& moves, const std::vector<SlotAssignment>& slots,
                      absl::StatusCode code, const std::string& field) {
    const Snapshot before = Snapshot::Of(*store_, rig_);
    const uint64_t rejected = store_->stats().plans_rejected;
    const uint64_t moved = store_->stats().move_count[0][1];
    std::vector<ReleasedSlot> released;
    absl::Status s = store_->ApplyPlan(moves, slots, &released);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    EXPECT_TRUE(released.empty());
    EXPECT_TRUE(Snapshot::Of(*store_, rig_) == before) << "a rejected plan changed the store";
    EXPECT_EQ(store_->stats().plans_rejected, rejected + 1);
    EXPECT_EQ(store_->stats().move_count[0][1], moved);
  }

  // A free, aligned DDR offset nobody uses.
  uint64_t FreeDdr(int i) const { return (1u << 20) + i * 65536u; }

  Rig rig_;
  std::unique_ptr<TieredKvStore> store_;
  uint64_t held_ddr_ = 0;
};

TEST_F(PlanValidationTest, AcceptsAValidPlan) {
  std::vector<ReleasedSlot> released;
  ASSERT_TRUE(store_
                  ->ApplyPlan({{0, 2, Tier::kT0, Tier::kT1}, {0, 0, Tier::kT1, Tier::kT0}},
                              {{FreeDdr(0)}, {0}}, &released)
                  .ok());
  EXPECT_EQ(released, (std::vector<ReleasedSlot>{{PoolKind::kDdr, held_ddr_}}));
  EXPECT_EQ(store_->TierOf(0, 2), Tier::kT1);
  EXPECT_EQ(store_->TierOf(0, 0), Tier::kT0);
}

TEST_F(PlanValidationTest, RejectsSlotCountMismatch) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {}, absl::StatusCode::kInvalidArgument,
                 "slots.size()");
}

TEST_F(PlanValidationTest, RejectsUnknownGroupAndPage) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}, {2, 0, Tier::kT0, Tier::kT1}},
                 {{FreeDdr(0)}, {FreeDdr(1)}}, absl::StatusCode::kInvalidArgument,
                 "moves[1].group");
  ExpectRejected({{0, 5, Tier::kT0, Tier::kT1}}, {{FreeDdr(0)}}, absl::StatusCode::kInvalidArgument,
                 "moves[0].page");
}

TEST_F(PlanValidationTest, RejectsDuplicatePage) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}, {0, 2, Tier::kT1, Tier::kT0}}, {{FreeDdr(0)}, {0}},
                 absl::StatusCode::kInvalidArgument, "duplicate");
}

TEST_F(PlanValidationTest, RejectsWrongSourceTier) {
  ExpectRejected({{0, 2, Tier::kT1, Tier::kT0}}, {{0}}, absl::StatusCode::kInvalidArgument,
                 "moves[0].from");
}

TEST_F(PlanValidationTest, RejectsNoOpAndEvictedSource) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT0}}, {{0}}, absl::StatusCode::kInvalidArgument,
                 "moves[0].to");
  ExpectRejected({{1, 2, Tier::kT3, Tier::kT0}}, {{0}}, absl::StatusCode::kInvalidArgument,
                 "evicted");
}

TEST_F(PlanValidationTest, RejectsBadSlots) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {{FreeDdr(0) + 4}},
                 absl::StatusCode::kInvalidArgument, "slots[0].dst_offset");
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {{rig_.ddr->size() - 256}},
                 absl::StatusCode::kInvalidArgument, "exceeds");
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {{uint64_t{1} << 62}},
                 absl::StatusCode::kInvalidArgument, "exceeds");
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {{held_ddr_}}, absl::StatusCode::kInvalidArgument,
                 "already holds");
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}, {0, 3, Tier::kT0, Tier::kT1}},
                 {{FreeDdr(0)}, {FreeDdr(0) + 256}}, absl::StatusCode::kInvalidArgument,
                 "overlaps slots[0]");
}

TEST_F(PlanValidationTest, RejectsCompressingOrEvictingThePartialTailPage) {
  ExpectRejected({{0, 4, Tier::kT0, Tier::kT3}}, {{0}}, absl::StatusCode::kInvalidArgument,
                 "partial page");
  ExpectRejected({{0, 4, Tier::kT0, Tier::kT2}}, {{FreeDdr(0)}}, absl::StatusCode::kInvalidArgument,
                 "partial page");
}

TEST_F(PlanValidationTest, TruncatedPlanWithABadLastMoveAppliesNothing) {
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1},
                  {0, 3, Tier::kT0, Tier::kT1},
                  {0, 0, Tier::kT1, Tier::kT0},
                  {0, 1, Tier::kT1, Tier::kT0}},  // page 1 is in T2, not T1
                 {{FreeDdr(0)}, {FreeDdr(1)}, {0}, {0}}, absl::StatusCode::kInvalidArgument,
                 "moves[3].from");
}

TEST_F(PlanValidationTest, RejectsPromotionsThatOverflowTheArena) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  Rig small(/*arena_bytes=*/3 * DdrSlotBytes(o.geometry, 0));
  o.num_q_heads = 9;
  auto store = small.MakeStore(o);
  std::mt19937 rng(2);
  testing::AppendRandom(rng, *store, 12);  // 3 pages fill the arena
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1}}, *small.slots).ok());
  testing::AppendRandom(rng, *store, 4);  // page 3 takes the freed room
  // Promote before demote: over capacity at step 0.
  auto s = store->ApplyPlan({{0, 0, Tier::kT1, Tier::kT0}, {0, 1, Tier::kT0, Tier::kT1}},
                            {{0}, {1u << 20}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("moves[0]"));
  EXPECT_EQ(store->TierOf(0, 0), Tier::kT1);
  // Demote first: fits.
  EXPECT_TRUE(store
                  ->ApplyPlan({{0, 1, Tier::kT0, Tier::kT1}, {0, 0, Tier::kT1, Tier::kT0}},
                              {{1u << 20}, {0}})
                  .ok());
}

TEST_F(PlanValidationTest, RejectsPlansMidForwardPass) {
  std::vector<float> kv(3 * 64, 1.f);
  ASSERT_TRUE(store_->Append(0, kv.data(), kv.data(), 1).ok());
  ExpectRejected({{0, 2, Tier::kT0, Tier::kT1}}, {{FreeDdr(0)}},
                 absl::StatusCode::kFailedPrecondition, "layers differ");
}

TEST(PlanTest, RejectsTiersWithoutAPool) {
  Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = *TieredKvStore::Create(o, StoreMemory{rig.arena.get(), nullptr, nullptr});
  std::mt19937 rng(3);
  testing::AppendRandom(rng, *store, 8);
  auto s = store->ApplyPlan({{0, 0, Tier::kT0, Tier::kT2}}, {{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no pool"));
}

TEST(PlanTest, CountsBytesPerDirection) {
  Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(4);
  testing::AppendRandom(rng, *store, 64);
  const uint64_t page = DdrSlotBytes(o.geometry, 0);
  const uint64_t packed = CompressedSlotBytes(codecs::Int8KiviCodec(), o.geometry, 0);
  ASSERT_TRUE(store
                  ->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1},
                                    {0, 1, Tier::kT0, Tier::kT1},
                                    {0, 2, Tier::kT0, Tier::kT2}},
                                   *rig.slots)
                  .ok());
  ASSERT_TRUE(store
                  ->ApplyPlanLocal({{0, 0, Tier::kT1, Tier::kT0},
                                    {0, 2, Tier::kT2, Tier::kT1},
                                    {0, 1, Tier::kT1, Tier::kT3}},
                                   *rig.slots)
                  .ok());
  const auto& st = store->stats();
  EXPECT_EQ(st.move_bytes[0][1], 2 * page);
  EXPECT_EQ(st.move_bytes[0][2], packed);
  EXPECT_EQ(st.move_bytes[1][0], page);
  EXPECT_EQ(st.move_bytes[2][1], page);
  EXPECT_EQ(st.move_count[1][3], 1u);
  EXPECT_EQ(st.move_bytes[1][3], 0u);
  EXPECT_EQ(st.plans_applied, 2u);
  EXPECT_GT(st.apply_nanos, 0u);
  // Local mode gave every released slot back: only page 2 (T1) holds one.
  EXPECT_EQ(rig.slots->GrantedSlots(PoolKind::kDdr), 1u);
  EXPECT_EQ(rig.slots->GrantedSlots(PoolKind::kCompressed), 0u);
}

TEST(PlanTest, LocalModeGivesNewSlotsBackWhenThePlanIsRejected) {
  Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(5);
  testing::AppendRandom(rng, *store, 16);
  auto s = store->ApplyPlanLocal(
      {{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT0, Tier::kT2}, {0, 2, Tier::kT1, Tier::kT0}},
      *rig.slots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.slots->GrantedSlots(PoolKind::kDdr), 0u);
  EXPECT_EQ(rig.slots->GrantedSlots(PoolKind::kCompressed), 0u);
  EXPECT_EQ(store->TierOf(0, 0), Tier::kT0);
}

// An arena that refuses its n-th allocation after FailAt(n): another sequence filling a shared
// arena between validation and execution.
class FlakyArena final : public DeviceArena {
 public:
  FlakyArena() : inner_(uint64_t{1} << 30) {}
  void FailAt(int n) {
    calls_ = 0;
    fail_at_ = n;
  }
  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes) override {
    if (++calls_ == fail_at_) return absl::ResourceExhaustedError("taken by another sequence");
    return inner_.Allocate(bytes);
  }
  void Free(uint8_t* block, uint64_t bytes) override { inner_.Free(block, bytes); }
  uint64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  uint64_t used_bytes() const override { return inner_.used_bytes(); }
  bool host_accessible() const override { return true; }

 private:
  HostArena inner_;
  int calls_ = 0;
  int fail_at_ = 0;  // 0 = never
};

TEST(PlanTest, ArenaRefusalMidPlanStopsThereWithEveryPageIntact) {
  Rig rig;
  FlakyArena arena;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = *TieredKvStore::Create(o, {&arena, rig.ddr.get(), rig.compressed.get()});
  std::mt19937 rng(6);
  testing::AppendRandom(rng, *store, 12);
  ASSERT_TRUE(
      store
          ->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT0, Tier::kT1}}, *rig.slots)
          .ok());
  std::vector<std::vector<float>> before(3, std::vector<float>(DdrSlotBytes(o.geometry, 0) / 4));
  for (uint32_t p = 0; p < 3; ++p) ASSERT_TRUE(store->ReadPage(0, p, before[p].data()).ok());
  arena.FailAt(2);  // the second promotion
  std::vector<ReleasedSlot> released;
  auto s = store->ApplyPlan({{0, 0, Tier::kT1, Tier::kT0}, {0, 1, Tier::kT1, Tier::kT0}},
                            {{0}, {0}}, &released);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("moves[1]"));
  EXPECT_EQ(store->TierOf(0, 0), Tier::kT0);
  EXPECT_EQ(store->TierOf(0, 1), Tier::kT1);
  EXPECT_EQ(released.size(), 1u);
  std::vector<float> got(before[0].size());
  for (uint32_t p = 0; p < 3; ++p) {
    ASSERT_TRUE(store->ReadPage(0, p, got.data()).ok());
    EXPECT_EQ(got, before[p]) << p;
  }
}

// Model of the bytes each page must hold: appends are written into it in the page layout; a
// page that enters T2 takes the (checked, approximate) dequantized bytes; every other move must
// preserve the bytes exactly.
class PageModel {
 public:
  explicit PageModel(const layout::KvGeometry& g) : g_(g) {}

  void Append(uint32_t layer, uint32_t pos, const float* k, const float* v) {
    const uint32_t group = g_.GroupOfLayer(layer);
    const uint32_t page = pos / g_.page_tokens;
    auto& pages = pages_[group];
    while (pages.size() <= page) pages.emplace_back(DdrSlotBytes(g_, group) / 4, 0.f);
    const size_t row = g_.ValuesPerTokenLayer();
    float* base = pages[page].data() + (layer - g_.GroupBegin(group)) * 2 * g_.page_tokens * row;
    std::memcpy(base + (pos % g_.page_tokens) * row, k, row * 4);
    std::memcpy(base + (g_.page_tokens + pos % g_.page_tokens) * row, v, row * 4);
  }
  std::vector<float>& page(uint32_t group, uint32_t p) { return pages_[group][p]; }

 private:
  layout::KvGeometry g_;
  std::map<uint32_t, std::vector<std::vector<float>>> pages_;
};

TEST(PlanPropertyTest, RandomPlanSequencesPreserveEveryPagesBytes) {
  for (uint32_t page_tokens : {1u, 16u, 5u}) {
    for (const char* codec : {"int8_kivi", "fp8_e4m3"}) {
      Rig rig;
      TieredKvStoreOptions o;
      o.geometry = SmolLmGeometry(page_tokens, 3);
      o.geometry.num_layers = 6;
      o.num_q_heads = 9;
      o.codec = codec;
      auto store = rig.MakeStore(o);
      PageModel model(o.geometry);
      std::mt19937 rng(page_tokens * 7 + codec[0]);
      const size_t row = o.geometry.ValuesPerTokenLayer();
      auto append = [&](uint32_t n) {
        for (uint32_t layer = 0; layer < o.geometry.num_layers; ++layer) {
          auto k = RandomVector(rng, n * row), v = RandomVector(rng, n * row);
          const uint32_t begin = store->Length(layer);
          ASSERT_TRUE(store->Append(layer, k.data(), v.data(), n).ok());
          for (uint32_t i = 0; i < n; ++i) {
            model.Append(layer, begin + i, k.data() + i * row, v.data() + i * row);
          }
        }
      };
      append(23);
      for (int round = 0; round < 25; ++round) {
        // A random plan over a random subset of live pages.
        const uint32_t pages = store->num_pages();
        const bool partial = store->Length(0) % page_tokens != 0;
        std::vector<Move> moves;
        for (uint32_t g = 0; g < 3; ++g) {
          for (uint32_t p = 0; p < pages; ++p) {
            const Tier from = store->TierOf(g, p);
            if (from == Tier::kT3 || rng() % 3 != 0) continue;
            Tier to = static_cast<Tier>(rng() % 4);
            if (rng() % 4 != 0 && to == Tier::kT3) to = Tier::kT1;  // evict rarely
            if (to == from) continue;
            if (partial && p + 1 == pages && (to == Tier::kT2 || to == Tier::kT3)) continue;
            moves.push_back({g, p, from, to});
          }
        }
        std::shuffle(moves.begin(), moves.end(), rng);
        ASSERT_TRUE(store->ApplyPlanLocal(moves, *rig.slots).ok());
        // Check every page against the model.
        std::vector<float> got(DdrSlotBytes(o.geometry, 0) / 4);
        for (const Move& m : moves) {
          if (m.to != Tier::kT2) continue;
          ASSERT_TRUE(store->ReadPage(m.group, m.page, got.data()).ok());
          auto& want = model.page(m.group, m.page);
          got.resize(want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            // Unit normal data: both codecs stay within 0.3 absolute per element.
            ASSERT_NEAR(got[i], want[i], 0.3) << codec << " page " << m.page;
          }
          want = got;  // from now on the page's bytes are these, exactly
        }
        uint32_t live_slots = 0;
        for (uint32_t g = 0; g < 3; ++g) {
          for (uint32_t p = 0; p < pages; ++p) {
            const Tier t = store->TierOf(g, p);
            live_slots += t == Tier::kT1 || t == Tier::kT2;
            if (t == Tier::kT3) continue;
            auto& want = model.page(g, p);
            got.resize(want.size());
            ASSERT_TRUE(store->ReadPage(g, p, got.data()).ok());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
                << "round " << round << " group " << g << " page " << p << " in "
                << tiering::TierName(t) << " lossy " << store->IsLossy(g, p);
          }
        }
        // No slot leaks: the allocator grants exactly the slots the store holds.
        ASSERT_EQ(rig.slots->GrantedSlots(PoolKind::kDdr) +
                      rig.slots->GrantedSlots(PoolKind::kCompressed),
                  live_slots);
        ASSERT_EQ(store->HeldSlots().size(), live_slots);
        append(1 + rng() % 6);
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::worker
