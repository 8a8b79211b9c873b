#include "worker/tiered_kv_store.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/store_rig.h"

namespace kvtier::worker {
namespace {

using ::kvtier::tiering::Move;
using ::kvtier::tiering::Tier;
using ::kvtier::worker::testing::RandomVector;
using ::kvtier::worker::testing::Rig;
using ::kvtier::worker::testing::SmolLmGeometry;
using ::testing::HasSubstr;

// Dense rows [n][heads][d] laid out heads first, [heads][n][d] with `pad` unused floats after
// each head's run (transformers' layout of one batch row), and the strides that read them.
std::vector<float> HeadsFirst(const std::vector<float>& dense, uint32_t n, uint32_t heads,
                              uint32_t d, uint32_t pad, RowStrides* strides) {
  const size_t run = size_t{n} * d + pad;
  std::vector<float> out(heads * run, NAN);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t h = 0; h < heads; ++h) {
      std::memcpy(out.data() + h * run + size_t{t} * d, dense.data() + (size_t{t} * heads + h) * d,
                  d * sizeof(float));
    }
  }
  *strides = {d, run};
  return out;
}

// Drives a reference store (every page in T0, never moved) and a store under test with the
// same tokens and queries, and compares their attention bit for bit (or within a tolerance).
// With heads_first, the store under test reads K, V and Q heads first through RowStrides.
class TwinDriver {
 public:
  TwinDriver(const TieredKvStoreOptions& options, uint32_t seed)
      : rig_(), rng_(seed), options_(options) {
    ref_ = rig_.MakeStore(options);
    test_ = rig_.MakeStore(options);
  }
  TieredKvStore& test() { return *test_; }
  TieredKvStore& ref() { return *ref_; }
  Rig& rig() { return rig_; }
  std::mt19937& rng() { return rng_; }
  void set_heads_first(bool on) { heads_first_ = on; }

  // One forward pass of n tokens: per layer, append then attend (as an engine does). Compares
  // outputs and position mass: exactly when tol < 0, else within tol.
  void Step(uint32_t n, double tol = -1) {
    const auto& g = options_.geometry;
    const size_t row = size_t{g.num_kv_heads} * g.head_dim;
    const size_t qrow = size_t{options_.num_q_heads} * g.head_dim;
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      auto k = RandomVector(rng_, n * row), v = RandomVector(rng_, n * row);
      ASSERT_TRUE(ref_->Append(layer, k.data(), v.data(), n).ok());
      auto q = RandomVector(rng_, n * qrow);
      const uint32_t len = ref_->Length(layer);
      std::vector<float> out_ref(n * qrow), out_test(n * qrow), mass_ref(len), mass_test(len);
      ASSERT_TRUE(ref_->Attend(layer, q.data(), n, out_ref.data(), mass_ref.data()).ok());
      if (heads_first_) {
        RowStrides ks, vs, qs;
        const auto kh = HeadsFirst(k, n, g.num_kv_heads, g.head_dim, layer % 3, &ks);
        // V dense on odd layers: one side strided, the other not.
        const auto vh = layer % 2 == 0 ? HeadsFirst(v, n, g.num_kv_heads, g.head_dim, 1, &vs) : v;
        const auto qh = HeadsFirst(q, n, options_.num_q_heads, g.head_dim, 2, &qs);
        ASSERT_TRUE(test_->Append(layer, kh.data(), ks, vh.data(), vs, n).ok());
        ASSERT_TRUE(
            test_->Attend(layer, qh.data(), n, out_test.data(), mass_test.data(), AttendMask{}, qs)
                .ok());
      } else {
        ASSERT_TRUE(test_->Append(layer, k.data(), v.data(), n).ok());
        ASSERT_TRUE(test_->Attend(layer, q.data(), n, out_test.data(), mass_test.data()).ok());
      }
      if (tol < 0) {
        ASSERT_EQ(std::memcmp(out_ref.data(), out_test.data(), out_ref.size() * 4), 0)
            << "layer " << layer << " length " << len;
        ASSERT_EQ(std::memcmp(mass_ref.data(), mass_test.data(), mass_ref.size() * 4), 0)
            << "layer " << layer << " length " << len;
      } else {
        for (size_t i = 0; i < out_ref.size(); ++i) {
          ASSERT_NEAR(out_ref[i], out_test[i], tol) << "layer " << layer << " i " << i;
        }
        for (size_t i = 0; i < mass_ref.size(); ++i) {
          ASSERT_NEAR(mass_ref[i], mass_test[i], tol * n * options_.num_q_heads) << i;
        }
      }
    }
  }

  // A random re-tiering among `tiers` for about `share` of the pages.
  void RandomRetier(std::vector<Tier> tiers, double share) {
    std::vector<Move> moves;
    std::bernoulli_distribution pick(share);
    const auto& g = options_.geometry;
    const uint32_t pages = test_->num_pages();
    const bool partial = test_->Length(0) % g.page_tokens != 0;
    for (uint32_t group = 0; group < g.layer_groups; ++group) {
      for (uint32_t page = 0; page < pages; ++page) {
        const Tier from = test_->TierOf(group, page);
        if (from == Tier::kT3 || !pick(rng_)) continue;
        std::vector<Tier> options;
        for (Tier t : tiers) {
          const bool tail_only = (t == Tier::kT2 || t == Tier::kT3) && partial && page + 1 == pages;
          if (t != from && !tail_only) options.push_back(t);
        }
        if (options.empty()) continue;
        moves.push_back(
            {group, page, from,
             options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng_)]});
      }
    }
    std::shuffle(moves.begin(), moves.end(), rng_);
    ASSERT_TRUE(test_->ApplyPlanLocal(moves, *rig_.slots).ok());
  }

 private:
  Rig rig_;
  std::mt19937 rng_;
  TieredKvStoreOptions options_;
  bool heads_first_ = false;
  std::unique_ptr<TieredKvStore> ref_, test_;
};

TieredKvStoreOptions RandomOptions(std::mt19937& rng) {
  auto pick = [&](std::vector<uint32_t> v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  TieredKvStoreOptions o;
  o.geometry.num_layers = pick({1, 2, 3, 5});
  o.geometry.num_kv_heads = pick({1, 2, 3});
  o.geometry.head_dim = pick({8, 16, 64, 12});
  o.geometry.page_tokens = pick({1, 16, 5, 7, 3});
  o.geometry.layer_groups = std::min(o.geometry.num_layers, pick({1, 2, 3}));
  o.num_q_heads = o.geometry.num_kv_heads * pick({1, 2, 3});
  o.portable_kernel = pick({0, 1}) == 1;
  return o;
}

TEST(TieredKvStoreZeroErrorTest, BitIdenticalWhateverTheT0T1SplitRandomizedShapes) {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 120; ++trial) {
    const TieredKvStoreOptions o = RandomOptions(rng);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " layers " << o.geometry.num_layers << " kv "
                 << o.geometry.num_kv_heads << " q " << o.num_q_heads << " d "
                 << o.geometry.head_dim << " page " << o.geometry.page_tokens << " groups "
                 << o.geometry.layer_groups << " portable " << o.portable_kernel);
    TwinDriver d(o, 100 + trial);
    d.Step(std::uniform_int_distribution<uint32_t>(1, 40)(d.rng()));
    for (int step = 0; step < 30; ++step) {
      if (step % 3 == 0) d.RandomRetier({Tier::kT0, Tier::kT1}, 0.5);
      ASSERT_NO_FATAL_FAILURE(d.Step(1));
    }
    // Everything in T1, then a prefill-sized chunk on top.
    d.RandomRetier({Tier::kT1}, 1.0);
    ASSERT_NO_FATAL_FAILURE(d.Step(5));
  }
}

// K, V and Q read heads first (transformers' [heads][n][head_dim] views, RowStrides) store and
// attend exactly what dense rows do, whatever the T0/T1 split.
TEST(TieredKvStoreZeroErrorTest, HeadsFirstRowsAreBitIdenticalToDenseRows) {
  std::mt19937 rng(2027);
  for (int trial = 0; trial < 40; ++trial) {
    const TieredKvStoreOptions o = RandomOptions(rng);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " kv " << o.geometry.num_kv_heads << " q " << o.num_q_heads
                 << " d " << o.geometry.head_dim << " page " << o.geometry.page_tokens);
    TwinDriver d(o, 500 + trial);
    d.set_heads_first(true);
    d.Step(std::uniform_int_distribution<uint32_t>(1, 40)(d.rng()));
    for (int step = 0; step < 12; ++step) {
      if (step % 3 == 0) d.RandomRetier({Tier::kT0, Tier::kT1}, 0.5);
      ASSERT_NO_FATAL_FAILURE(d.Step(1));
    }
    d.RandomRetier({Tier::kT1}, 1.0);
    ASSERT_NO_FATAL_FAILURE(d.Step(5));
  }
}

TEST(TieredKvStoreZeroErrorTest, BitIdenticalForSmolLmGeometryAllPageSizes) {
  for (uint32_t page_tokens : {1u, 16u, 7u}) {
    for (uint32_t groups : {1u, 30u}) {
      TieredKvStoreOptions o;
      o.geometry = SmolLmGeometry(page_tokens, groups);
      o.num_q_heads = 9;
      TwinDriver d(o, page_tokens * 31 + groups);
      ASSERT_NO_FATAL_FAILURE(d.Step(37));
      for (int step = 0; step < 20; ++step) {
        d.RandomRetier({Tier::kT0, Tier::kT1}, 0.4);
        ASSERT_NO_FATAL_FAILURE(d.Step(1));
      }
    }
  }
}

TEST(TieredKvStoreTest, CompressedPagesStayCloseToFullPrecision) {
  for (const char* codec : {"int8_kivi", "fp8_e4m3", "minmax"}) {
    TieredKvStoreOptions o;
    o.geometry = SmolLmGeometry(16);
    o.geometry.num_layers = 4;
    o.num_q_heads = 9;
    o.codec = codec;
    TwinDriver d(o, 9);
    ASSERT_NO_FATAL_FAILURE(d.Step(64));
    d.RandomRetier({Tier::kT1, Tier::kT2}, 0.8);
    // Unit-normal K/V. int8 KIVI: error <= range/510 per group (~0.01); per-tensor min-max:
    // a wider range; fp8 e4m3: up to 1/16 relative (3 mantissa bits), ~0.25 at |x| = 4.
    const std::string name = codec;
    const double tol = name == "int8_kivi" ? 0.03 : 0.1;
    ASSERT_NO_FATAL_FAILURE(d.Step(1, tol)) << codec;
  }
}

// A sequence re-opening under a new daemon session moves to new pools: only once no page lives
// in the old ones, and the pages it promoted home read exactly as before.
TEST(TieredKvStoreTest, RebindPoolsOnlyWhenNoPageLivesInTheOldOnes) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.num_q_heads = 3;
  testing::Rig rig;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(5);
  ASSERT_NO_FATAL_FAILURE(testing::AppendRandom(rng, *store, 64));
  const uint64_t page_floats = DdrSlotBytes(o.geometry, 0) / 4;
  std::vector<float> before(page_floats), after(page_floats);
  ASSERT_TRUE(store->ReadPage(0, 1, before.data()).ok());
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 1, Tier::kT0, Tier::kT1}}, *rig.slots).ok());
  testing::Rig other;
  absl::Status busy = store->RebindPools(other.ddr.get(), other.compressed.get());
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("1 pages in T1"), absl::string_view::npos) << busy;
  ASSERT_TRUE(store->ApplyPlan({{0, 1, Tier::kT1, Tier::kT0}}, {SlotAssignment{}}).ok());
  ASSERT_TRUE(store->RebindPools(other.ddr.get(), other.compressed.get()).ok());
  ASSERT_TRUE(store->ReadPage(0, 1, after.data()).ok());
  EXPECT_EQ(before, after);
  // The new pools serve the next offload.
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 2, Tier::kT0, Tier::kT1}}, *other.slots).ok());
  EXPECT_EQ(store->TierOf(0, 2), Tier::kT1);
}

TEST(TieredKvStoreTest, StagingDequantizesEachT2PageLayerOnce) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.num_q_heads = 9;
  TwinDriver d(o, 4);
  ASSERT_NO_FATAL_FAILURE(d.Step(48));
  ASSERT_TRUE(d.test()
                  .ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT2}, {0, 1, Tier::kT0, Tier::kT2}},
                                  *d.rig().slots)
                  .ok());
  ASSERT_NO_FATAL_FAILURE(d.Step(1, 0.03));
  EXPECT_EQ(d.test().stats().t2_layers_dequantized, 4u);  // 2 pages x 2 layers
  EXPECT_EQ(d.test().stats().t2_layers_reused, 0u);
  ASSERT_NO_FATAL_FAILURE(d.Step(1, 0.03));
  EXPECT_EQ(d.test().stats().t2_layers_dequantized, 4u);
  EXPECT_EQ(d.test().stats().t2_layers_reused, 4u);
  // A page that leaves T2 is no longer staged; coming back means decoding again.
  ASSERT_TRUE(d.test().ApplyPlanLocal({{0, 0, Tier::kT2, Tier::kT1}}, *d.rig().slots).ok());
  ASSERT_TRUE(d.test().ApplyPlanLocal({{0, 0, Tier::kT1, Tier::kT2}}, *d.rig().slots).ok());
  ASSERT_NO_FATAL_FAILURE(d.Step(1, 0.03));
  EXPECT_EQ(d.test().stats().t2_layers_dequantized, 6u);
  EXPECT_EQ(d.test().stats().t2_layers_reused, 6u);
}

TEST(TieredKvStoreTest, StagingCapBoundsKeptPages) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  o.max_staged_pages = 1;
  TwinDriver d(o, 5);
  ASSERT_NO_FATAL_FAILURE(d.Step(16));
  ASSERT_TRUE(d.test()
                  .ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT2}, {0, 1, Tier::kT0, Tier::kT2}},
                                  *d.rig().slots)
                  .ok());
  ASSERT_NO_FATAL_FAILURE(d.Step(1, 0.03));
  ASSERT_NO_FATAL_FAILURE(d.Step(1, 0.03));
  // With room for one staged page, at least one of the two is decoded again.
  EXPECT_GE(d.test().stats().t2_layers_dequantized, 3u);
}

TEST(TieredKvStoreTest, EvictedPagesGetNoMassAndTheRestStillSumsToOne) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(8);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(1);
  testing::AppendRandom(rng, *store, 40);
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 1, Tier::kT0, Tier::kT3}}, *rig.slots).ok());
  auto q = RandomVector(rng, 9 * 64);
  std::vector<float> out(9 * 64), mass(40);
  ASSERT_TRUE(store->Attend(0, q.data(), 1, out.data(), mass.data()).ok());
  double total = 0;
  for (uint32_t p = 0; p < 40; ++p) {
    if (p >= 8 && p < 16) {
      EXPECT_EQ(mass[p], 0.f) << p;
    }
    total += mass[p];
  }
  EXPECT_NEAR(total, 9.0, 1e-4);
  EXPECT_FALSE(store->ReadPage(0, 1, out.data()).ok());
}

TEST(TieredKvStoreTest, KeepMaskSkipsPositionsPerHead) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.num_q_heads = 9;
  o.keep_mask = true;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(2);
  testing::AppendRandom(rng, *store, 20);
  // Mask position 3 for every kv head of layer 1, position 5 only for kv head 0.
  for (uint32_t h = 0; h < 3; ++h) ASSERT_TRUE(store->SetKeep(1, h, 3, false).ok());
  ASSERT_TRUE(store->SetKeep(1, 0, 5, false).ok());
  auto q = RandomVector(rng, 9 * 64);
  std::vector<float> out(9 * 64), mass1(20), mass0(20);
  ASSERT_TRUE(store->Attend(1, q.data(), 1, out.data(), mass1.data()).ok());
  ASSERT_TRUE(store->Attend(0, q.data(), 1, out.data(), mass0.data()).ok());
  EXPECT_EQ(mass1[3], 0.f);
  EXPECT_GT(mass1[5], 0.f);  // kv heads 1 and 2 still see it
  EXPECT_GT(mass0[3], 0.f);  // other layers are unaffected
  EXPECT_EQ(store->SetKeep(1, 3, 0, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->SetKeep(1, 0, 20, false).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TieredKvStoreTest, SetKeepNeedsTheOption) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(3);
  testing::AppendRandom(rng, *store, 2);
  EXPECT_EQ(store->SetKeep(0, 0, 0, false).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TieredKvStoreTest, AppendIntoT2PageIsRejectedAndStoresNothing) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(4);
  testing::AppendRandom(rng, *store, 8);  // two full pages
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 1, Tier::kT0, Tier::kT2}}, *rig.slots).ok());
  // Growing page 1 would need... nothing: page 1 is full, the next token opens page 2.
  testing::AppendRandom(rng, *store, 1);
  EXPECT_EQ(store->Length(0), 9u);
  // Appends into an offloaded (T1) tail page write the slot in place.
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 2, Tier::kT0, Tier::kT1}}, *rig.slots).ok());
  testing::AppendRandom(rng, *store, 2);
  EXPECT_EQ(store->Length(0), 11u);
  EXPECT_EQ(store->TierOf(0, 2), Tier::kT1);
}

TEST(TieredKvStoreTest, AppendFailsCleanlyWhenTheArenaIsFull) {
  Rig rig(/*arena_bytes=*/2 * 2 * 4 * 3 * 64 * 4);  // two pages of 4 tokens, one layer
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(4);
  o.geometry.num_layers = 1;
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::vector<float> kv(12 * 3 * 64, 1.f);
  EXPECT_EQ(store->Append(0, kv.data(), kv.data(), 12).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Length(0), 0u);
  EXPECT_EQ(rig.arena->used_bytes(), 0u);
  ASSERT_TRUE(store->Append(0, kv.data(), kv.data(), 8).ok());
  // Offloading makes room.
  ASSERT_TRUE(store->ApplyPlanLocal({{0, 0, Tier::kT0, Tier::kT1}}, *rig.slots).ok());
  EXPECT_TRUE(store->Append(0, kv.data(), kv.data(), 4).ok());
}

TEST(TieredKvStoreTest, CreateRejectsBadOptionsNamingTheField) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.num_q_heads = 9;
  auto bad = o;
  bad.geometry.element_bytes = 2;
  auto s = TieredKvStore::Create(bad, rig.Memory()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element_bytes"));
  bad = o;
  bad.num_q_heads = 10;
  s = TieredKvStore::Create(bad, rig.Memory()).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_q_heads"));
  bad = o;
  bad.codec = "int3";
  s = TieredKvStore::Create(bad, rig.Memory()).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("int3"));
  s = TieredKvStore::Create(o, StoreMemory{}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("arena"));
}

TEST(TieredKvStoreTest, AttendRejectsBadArguments) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.num_q_heads = 9;
  auto store = rig.MakeStore(o);
  std::mt19937 rng(5);
  testing::AppendRandom(rng, *store, 3);
  std::vector<float> q(4 * 9 * 64), out(q.size());
  EXPECT_EQ(store->Attend(0, q.data(), 4, out.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Attend(30, q.data(), 1, out.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Attend(0, q.data(), 0, out.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Host mass through AttendBatch: one pointer per store, the same bytes as one Attend each.
TEST(TieredKvStoreTest, AttendBatchFillsEachStoresPositionMass) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.num_q_heads = 9;
  std::mt19937 rng(8);
  auto a = rig.MakeStore(o), b = rig.MakeStore(o);
  testing::AppendRandom(rng, *a, 20);
  testing::AppendRandom(rng, *b, 37);
  const size_t q_row = 9 * 64;
  const std::vector<float> q = RandomVector(rng, 2 * q_row);
  std::vector<float> out(2 * q_row), mass_a(20), mass_b(37);
  ASSERT_TRUE(TieredKvStore::AttendBatch({a.get(), b.get()}, 3, q.data(), out.data(),
                                         {mass_a.data(), mass_b.data()})
                  .ok());
  std::vector<float> want_out(q_row), want_mass(37);
  ASSERT_TRUE(b->Attend(3, q.data() + q_row, 1, want_out.data(), want_mass.data()).ok());
  EXPECT_EQ(0, std::memcmp(out.data() + q_row, want_out.data(), q_row * 4));
  EXPECT_EQ(0, std::memcmp(mass_b.data(), want_mass.data(), 37 * 4));
  double sum = 0;
  for (float x : mass_a) sum += x;
  EXPECT_NEAR(sum, 9.0, 1e-4);  // one query's softmax over 9 heads
}

TEST(TieredKvStoreTest, AttendBatchRejectsBadArgumentsNamingTheStore) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.num_q_heads = 9;
  std::mt19937 rng(6);
  auto a = rig.MakeStore(o), b = rig.MakeStore(o), empty = rig.MakeStore(o);
  testing::AppendRandom(rng, *a, 3);
  testing::AppendRandom(rng, *b, 5);
  TieredKvStoreOptions other = o;
  other.num_q_heads = 3;
  auto narrow = rig.MakeStore(other);
  testing::AppendRandom(rng, *narrow, 3);
  TieredKvStoreOptions paged = o;
  paged.geometry = SmolLmGeometry(8);
  auto small_pages = rig.MakeStore(paged);
  testing::AppendRandom(rng, *small_pages, 3);
  std::vector<float> q(3 * 9 * 64), out(q.size()), mass(8);
  auto message = [&](const std::vector<TieredKvStore*>& stores, uint32_t layer,
                     const std::vector<float*>& masses = {}) {
    absl::Status s = TieredKvStore::AttendBatch(stores, layer, q.data(), out.data(), masses);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(message({}, 0), HasSubstr("stores must not be empty"));
  EXPECT_THAT(message({a.get(), nullptr}, 0), HasSubstr("stores[1] is null"));
  EXPECT_THAT(message({a.get(), b.get(), a.get()}, 0), HasSubstr("stores[2] is listed twice"));
  EXPECT_THAT(message({a.get(), narrow.get()}, 0), HasSubstr("stores[1] has another geometry"));
  EXPECT_THAT(message({a.get(), small_pages.get()}, 0),
              HasSubstr("stores[1] has another geometry"));
  EXPECT_THAT(message({a.get(), b.get()}, 30), HasSubstr("stores[0]: layer 30 out of range"));
  EXPECT_THAT(message({b.get(), empty.get()}, 0), HasSubstr("stores[1]: n (1) must be in [1"));
  EXPECT_THAT(message({a.get(), b.get()}, 0, {mass.data()}), HasSubstr("position_mass.size() (1)"));
  // A refused batch attended nothing: the output is untouched.
  std::fill(out.begin(), out.end(), 7.f);
  message({a.get(), b.get()}, 30);
  EXPECT_EQ(out[0], 7.f);
  EXPECT_EQ(out[9 * 64], 7.f);
}

// bf16 pages are a device backend's option: the host backend, and a runtime on it, refuse them
// naming the field and the value.
TEST(TieredKvStoreTest, HostBackendRefusesBf16Pages) {
  testing::Rig rig;
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.element_bytes = 2;
  o.num_q_heads = 9;
  absl::Status s = TieredKvStore::Create(o, rig.Memory()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("geometry.element_bytes must be 4 (f32) on this backend, got 2"));
}

TEST(TieredKvStoreTest, SlotSizesFollowGeometryAndCodec) {
  const auto g = SmolLmGeometry(16, 30);
  EXPECT_EQ(DdrSlotBytes(g, 0), 2u * 16 * 3 * 64 * 4);
  // int8 KIVI: per layer K (192 channel scales+mins + 16x192 codes) and V (16 token
  // scales+mins + codes), each block rounded to 16 bytes.
  EXPECT_EQ(CompressedSlotBytes(codecs::Int8KiviCodec(), g, 0),
            (192u * 8 + 16 * 192) + (16u * 8 + 16 * 192));
  EXPECT_LT(CompressedSlotBytes(codecs::Int8KiviCodec(), g, 0) * 3, DdrSlotBytes(g, 0));
}

}  // namespace
}  // namespace kvtier::worker

namespace kvtier::worker {
namespace {

// Split attention (prefetch schedules): the pages a schedule leaves in host memory are attended
// as a second partial and merged by log-sum-exp. Not bit-identical (the zero-error tests above
// check the unsplit mode, where staged and in-place pages are read by one kernel call): exact up
// to one merge's rounding, a few ulp of outputs that are averages of unit-scale values.
constexpr double kSplitTolerance = 4e-6;

TEST(TieredKvStoreSplitTest, SplitAttentionMatchesUnsplitWithinOneMergesRounding) {
  std::mt19937 rng(77);
  uint64_t split = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const TieredKvStoreOptions o = RandomOptions(rng);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " page " << o.geometry.page_tokens
                                      << " groups " << o.geometry.layer_groups);
    TwinDriver d(o, 500 + trial);
    d.Step(std::uniform_int_distribution<uint32_t>(8, 40)(d.rng()));
    for (int step = 0; step < 24; ++step) {
      if (step % 4 == 0) {
        d.RandomRetier({Tier::kT0, Tier::kT1}, 0.5);
        // About half of the T1 pages of each group attended in place.
        std::vector<std::vector<uint32_t>> in_place(o.geometry.layer_groups);
        std::bernoulli_distribution pick(0.5);
        for (uint32_t g = 0; g < o.geometry.layer_groups; ++g) {
          for (uint32_t p = 0; p < d.test().num_pages(); ++p) {
            if (d.test().TierOf(g, p) == Tier::kT1 && pick(d.rng())) in_place[g].push_back(p);
          }
        }
        ASSERT_TRUE(d.test().SetInPlacePages(in_place).ok());
      }
      ASSERT_NO_FATAL_FAILURE(d.Step(1, kSplitTolerance));
    }
    split += d.test().stats().split_attends;
  }
  EXPECT_GT(split, 500u) << "attention really ran split";
}

TEST(TieredKvStoreSplitTest, InPlacePagesMustLiveInHostMemoryAndARefusalChangesNothing) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16, 2);
  o.num_q_heads = 9;
  TwinDriver d(o, 9);
  d.Step(64);  // 4 pages a group, all in T0
  ASSERT_TRUE(d.test()
                  .ApplyPlanLocal({{0, 1, Tier::kT0, Tier::kT1}, {1, 2, Tier::kT0, Tier::kT1}},
                                  *d.rig().slots)
                  .ok());
  ASSERT_TRUE(d.test().SetInPlacePages({{1}, {2}}).ok());
  EXPECT_EQ(d.test().in_place_pages(), 2u);
  struct Case {
    std::vector<std::vector<uint32_t>> lists;
    const char* says;
  };
  const Case cases[] = {
      {{{0}, {}}, "group 0 page 0 is in T0"},
      {{{1}, {9}}, "group 1 page 9 does not exist"},
      {{{1, 1}, {}}, "listed twice"},
      {{{1}}, "expected layer_groups = 2"},
  };
  for (const Case& c : cases) {
    absl::Status s = d.test().SetInPlacePages(c.lists);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
    EXPECT_EQ(d.test().in_place_pages(), 2u) << "the schedule in force stays";
  }
  // A page promoted back to T0 is attended with the rest: bit-identical to the reference again.
  ASSERT_TRUE(d.test()
                  .ApplyPlanLocal({{0, 1, Tier::kT1, Tier::kT0}, {1, 2, Tier::kT1, Tier::kT0}},
                                  *d.rig().slots)
                  .ok());
  const uint64_t before = d.test().stats().split_attends;
  ASSERT_NO_FATAL_FAILURE(d.Step(1));
  EXPECT_EQ(d.test().stats().split_attends, before);
  ASSERT_TRUE(d.test().SetInPlacePages({}).ok());
  EXPECT_EQ(d.test().in_place_pages(), 0u);
}

}  // namespace
}  // namespace kvtier::worker
