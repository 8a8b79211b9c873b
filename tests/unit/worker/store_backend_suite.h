#ifndef KVTIER_TESTS_UNIT_WORKER_STORE_BACKEND_SUITE_H_
#define KVTIER_TESTS_UNIT_WORKER_STORE_BACKEND_SUITE_H_

// One suite, two backends: the core behaviour of TieredKvStore (appends, plans in every
// direction, T0/T1 bit-exactness, the T2 error bound, refused plans) written once against a
// StoreHarness. tests/unit/worker/store_backend_suite_test.cc instantiates it over the host
// backend; tests/gpu/cuda/store_backend_gpu_test.cc over the CUDA backend (label gpu; skipped
// without a device). Include from exactly one test file per binary.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/store_rig.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker::testing {

// Makes stores over one backend and moves the engine's tensors to where that backend wants
// them (host memory, or device memory).
class StoreHarness {
 public:
  virtual ~StoreHarness() = default;
  // Empty when the backend can run here; otherwise why not (the test skips).
  virtual std::string Unavailable() const { return ""; }
  virtual std::unique_ptr<TieredKvStore> MakeStore(const TieredKvStoreOptions& options) = 0;
  // k, v: [n][kv_heads][head_dim]; q, out: [n][q_heads][head_dim], host vectors.
  virtual absl::Status Append(TieredKvStore& store, uint32_t layer, const std::vector<float>& k,
                              const std::vector<float>& v, uint32_t n) = 0;
  virtual absl::Status Attend(TieredKvStore& store, uint32_t layer, const std::vector<float>& q,
                              uint32_t n, std::vector<float>* out) = 0;
  // TieredKvStore::AttendBatch over `stores` (one query each, q [stores][q_heads][head_dim]).
  virtual absl::Status AttendBatch(const std::vector<TieredKvStore*>& stores, uint32_t layer,
                                   const std::vector<float>& q, std::vector<float>* out) = 0;
  SlotSource& slots() { return *rig_.slots; }

 protected:
  Rig rig_;
};

struct HarnessFactory {
  std::string name;
  std::function<std::unique_ptr<StoreHarness>()> make;
};

inline std::string HarnessName(const ::testing::TestParamInfo<HarnessFactory>& info) {
  return info.param.name;
}

class StoreBackendSuite : public ::testing::TestWithParam<HarnessFactory> {
 protected:
  void SetUp() override {
    harness_ = GetParam().make();
    const std::string why = harness_->Unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }

  // SmolLM's heads (q 9, kv 3, head_dim 64), 4 layers: both backends' kernels serve it.
  static TieredKvStoreOptions Options(uint32_t groups) {
    TieredKvStoreOptions o;
    o.geometry = SmolLmGeometry(16, groups);
    o.geometry.num_layers = 4;
    o.num_q_heads = 9;
    return o;
  }
  // Appends n random tokens to every layer of every store given (the same tokens).
  void AppendAll(const std::vector<TieredKvStore*>& stores, uint32_t n) {
    const auto& g = stores[0]->geometry();
    const size_t row = g.ValuesPerTokenLayer();
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      auto k = RandomVector(rng_, n * row), v = RandomVector(rng_, n * row);
      for (TieredKvStore* s : stores) ASSERT_TRUE(harness_->Append(*s, layer, k, v, n).ok());
    }
  }
  std::vector<float> Read(TieredKvStore& store, uint32_t group, uint32_t page) {
    std::vector<float> out(store.geometry().PageBytes(group) / 4);
    EXPECT_TRUE(store.ReadPage(group, page, out.data()).ok());
    return out;
  }
  // Every layer attended by the last n queries, outputs concatenated.
  std::vector<float> AttendAll(TieredKvStore& store, const std::vector<std::vector<float>>& qs,
                               uint32_t n) {
    std::vector<float> all;
    for (uint32_t layer = 0; layer < qs.size(); ++layer) {
      std::vector<float> out;
      EXPECT_TRUE(harness_->Attend(store, layer, qs[layer], n, &out).ok());
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  }
  std::vector<std::vector<float>> Queries(const TieredKvStore& store, uint32_t n) {
    std::vector<std::vector<float>> qs;
    const size_t row = size_t{9} * store.geometry().head_dim;
    for (uint32_t l = 0; l < store.geometry().num_layers; ++l)
      qs.push_back(RandomVector(rng_, n * row));
    return qs;
  }
  absl::Status Apply(TieredKvStore& store, const std::vector<tiering::Move>& moves) {
    return store.ApplyPlanLocal(moves, harness_->slots());
  }

  std::unique_ptr<StoreHarness> harness_;
  std::mt19937 rng_{2026};
};

TEST_P(StoreBackendSuite, AppendedPagesReadBackExactly) {
  auto store = harness_->MakeStore(Options(1));
  ASSERT_NE(store, nullptr);
  const auto& g = store->geometry();
  const size_t row = g.ValuesPerTokenLayer();
  std::vector<std::vector<float>> ks, vs;
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    ks.push_back(RandomVector(rng_, 20 * row));
    vs.push_back(RandomVector(rng_, 20 * row));
    ASSERT_TRUE(harness_->Append(*store, layer, ks[layer], vs[layer], 20).ok());
  }
  ASSERT_EQ(store->num_pages(), 2u);
  const std::vector<float> page1 = Read(*store, 0, 1);
  // Layer 2's K row of position 17 (page 1, row 1), and its V row.
  const size_t block = size_t{g.page_tokens} * row;
  EXPECT_EQ(0, std::memcmp(page1.data() + 2 * 2 * block + row, ks[2].data() + 17 * row, row * 4));
  EXPECT_EQ(
      0, std::memcmp(page1.data() + 2 * 2 * block + block + row, vs[2].data() + 17 * row, row * 4));
  // Rows past the length read as zeros.
  EXPECT_EQ(page1[2 * 2 * block + 4 * row], 0.f);
}

TEST_P(StoreBackendSuite, PlansInEveryDirectionKeepThePagesBytes) {
  for (uint32_t groups : {1u, 2u}) {
    auto store = harness_->MakeStore(Options(groups));
    ASSERT_NE(store, nullptr);
    AppendAll({store.get()}, 16 * 6 + 5);
    std::vector<std::vector<float>> original(groups * 7);
    for (uint32_t g = 0; g < groups; ++g) {
      for (uint32_t p = 0; p < 7; ++p) original[g * 7 + p] = Read(*store, g, p);
    }
    using tiering::Tier;
    // Every direction, page 6 (being written) left alone.
    const std::vector<std::vector<tiering::Move>> plans = {
        {{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT0, Tier::kT2}, {0, 2, Tier::kT0, Tier::kT3}},
        {{0, 0, Tier::kT1, Tier::kT2}, {0, 1, Tier::kT2, Tier::kT1}, {0, 3, Tier::kT0, Tier::kT1}},
        {{0, 0, Tier::kT2, Tier::kT0}, {0, 1, Tier::kT1, Tier::kT0}, {0, 3, Tier::kT1, Tier::kT3}},
        {{0, 4, Tier::kT0, Tier::kT2}, {0, 5, Tier::kT0, Tier::kT1}},
        {{0, 4, Tier::kT2, Tier::kT3}, {0, 5, Tier::kT1, Tier::kT0}},
    };
    for (const auto& plan : plans) {
      std::vector<tiering::Move> moves = plan;
      if (groups == 2) {
        for (const auto& m : plan) moves.push_back({1, m.page, m.from, m.to});
      }
      ASSERT_TRUE(Apply(*store, moves).ok());
      for (uint32_t g = 0; g < groups; ++g) {
        for (uint32_t p = 0; p < 7; ++p) {
          if (store->TierOf(g, p) == Tier::kT3) continue;
          const std::vector<float> now = Read(*store, g, p);
          const std::vector<float>& was = original[g * 7 + p];
          if (!store->IsLossy(g, p)) {
            ASSERT_EQ(0, std::memcmp(now.data(), was.data(), was.size() * 4))
                << "group " << g << " page " << p;
            continue;
          }
          // 8-bit codes of N(0, 1) values: a few hundredths at most.
          for (size_t i = 0; i < was.size(); ++i) {
            ASSERT_NEAR(now[i], was[i], 0.06f) << "group " << g << " page " << p << " i " << i;
          }
        }
      }
    }
    EXPECT_EQ(store->TierOf(0, 6), Tier::kT0);
  }
}

// Several sequences of different lengths and placements attended in one batch (one kernel on a
// device) give, bit for bit, what one Attend per store gives, and the same device scores.
TEST_P(StoreBackendSuite, AttendBatchGivesWhatOneAttendPerStoreGives) {
  using tiering::Tier;
  std::vector<std::unique_ptr<TieredKvStore>> one, batch;
  const std::vector<uint32_t> lengths = {16 * 3 + 1, 16 * 7 + 9, 5, 16 * 5};
  for (uint32_t length : lengths) {
    one.push_back(harness_->MakeStore(Options(1)));
    batch.push_back(harness_->MakeStore(Options(1)));
    ASSERT_NE(one.back(), nullptr);
    ASSERT_NE(batch.back(), nullptr);
    AppendAll({one.back().get(), batch.back().get()}, length);
  }
  // Store 1: pages in T1 and one evicted; store 3: every full page but the last in T1.
  const std::vector<std::vector<tiering::Move>> plans = {
      {},
      {{0, 0, Tier::kT0, Tier::kT1}, {0, 2, Tier::kT0, Tier::kT1}, {0, 4, Tier::kT0, Tier::kT3}},
      {},
      {{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT0, Tier::kT1}, {0, 2, Tier::kT0, Tier::kT1}}};
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_TRUE(Apply(*one[i], plans[i]).ok());
    ASSERT_TRUE(Apply(*batch[i], plans[i]).ok());
  }
  std::vector<TieredKvStore*> stores;
  for (auto& s : batch) stores.push_back(s.get());
  const size_t q_row = size_t{9} * one[0]->geometry().head_dim;
  for (int step = 0; step < 3; ++step) {
    std::vector<TieredKvStore*> all;
    for (size_t i = 0; i < lengths.size(); ++i)
      all.insert(all.end(), {one[i].get(), batch[i].get()});
    AppendAll(all, 1);
    for (uint32_t layer = 0; layer < one[0]->geometry().num_layers; ++layer) {
      const std::vector<float> q = RandomVector(rng_, lengths.size() * q_row);
      std::vector<float> want;
      for (size_t i = 0; i < lengths.size(); ++i) {
        std::vector<float> out;
        ASSERT_TRUE(
            harness_
                ->Attend(*one[i], layer,
                         std::vector<float>(q.begin() + i * q_row, q.begin() + (i + 1) * q_row), 1,
                         &out)
                .ok());
        want.insert(want.end(), out.begin(), out.end());
      }
      std::vector<float> got;
      absl::Status s = harness_->AttendBatch(stores, layer, q, &got);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
          << "step " << step << " layer " << layer;
    }
  }
  if (!one[0]->backend().device_scores()) return;
  for (size_t i = 0; i < lengths.size(); ++i) {
    auto a = one[i]->TakeDeviceScores(), b = batch[i]->TakeDeviceScores();
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ((*a)[0].size(), (*b)[0].size());
    EXPECT_EQ(0, std::memcmp((*a)[0].data(), (*b)[0].data(), (*a)[0].size() * 4)) << "store " << i;
  }
}

TEST_P(StoreBackendSuite, AttentionIsBitIdenticalWhateverTheT0T1Split) {
  auto ref = harness_->MakeStore(Options(1));
  auto test = harness_->MakeStore(Options(1));
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(test, nullptr);
  AppendAll({ref.get(), test.get()}, 16 * 8 + 3);  // a prefill
  auto qs = Queries(*ref, 5);
  EXPECT_EQ(AttendAll(*ref, qs, 5), AttendAll(*test, qs, 5));
  std::bernoulli_distribution offload(0.5);
  for (int step = 0; step < 24; ++step) {
    if (step % 6 == 0) {
      std::vector<tiering::Move> moves;
      const uint32_t full_pages = test->Length(0) / 16;
      for (uint32_t p = 0; p < full_pages; ++p) {
        const tiering::Tier want = offload(rng_) ? tiering::Tier::kT1 : tiering::Tier::kT0;
        if (test->TierOf(0, p) != want) moves.push_back({0, p, test->TierOf(0, p), want});
      }
      ASSERT_TRUE(Apply(*test, moves).ok());
    }
    AppendAll({ref.get(), test.get()}, 1);
    qs = Queries(*ref, 1);
    const std::vector<float> a = AttendAll(*ref, qs, 1), b = AttendAll(*test, qs, 1);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "step " << step;
  }
  if (ref->backend().device_scores()) {  // the scores the device kept are bit-identical too
    auto sa = ref->TakeDeviceScores(), sb = test->TakeDeviceScores();
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(*sa, *sb);
  }
}

TEST_P(StoreBackendSuite, CompressedPagesStayCloseToFullPrecision) {
  auto ref = harness_->MakeStore(Options(1));
  auto test = harness_->MakeStore(Options(1));
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(test, nullptr);
  AppendAll({ref.get(), test.get()}, 16 * 8);
  std::vector<tiering::Move> moves;
  for (uint32_t p = 0; p < 8; p += 2)
    moves.push_back({0, p, tiering::Tier::kT0, tiering::Tier::kT2});
  ASSERT_TRUE(Apply(*test, moves).ok());
  AppendAll({ref.get(), test.get()}, 1);
  const auto qs = Queries(*ref, 1);
  const std::vector<float> a = AttendAll(*ref, qs, 1), b = AttendAll(*test, qs, 1);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(worst, 0.0);  // the T2 pages were really read through their 8-bit codes
}

TEST_P(StoreBackendSuite, RefusedPlanChangesNothing) {
  auto store = harness_->MakeStore(Options(1));
  ASSERT_NE(store, nullptr);
  AppendAll({store.get()}, 40);
  const std::vector<float> page0 = Read(*store, 0, 0);
  using tiering::Tier;
  // moves[1] claims a page in T1 that is in T0.
  absl::Status s = Apply(*store, {{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT1, Tier::kT0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("moves[1]"));
  EXPECT_EQ(store->TierOf(0, 0), Tier::kT0);
  EXPECT_EQ(store->stats().plans_rejected, 1u);
  EXPECT_EQ(Read(*store, 0, 0), page0);
}

}  // namespace kvtier::worker::testing

#endif  // KVTIER_TESTS_UNIT_WORKER_STORE_BACKEND_SUITE_H_
