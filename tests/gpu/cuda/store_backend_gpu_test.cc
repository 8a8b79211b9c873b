// The store suite over the CUDA backend (T0 in HBM, pools pinned, attention and scores on the
// device): the same tests the host backend passes. Skipped without a device.

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "tests/unit/worker/store_backend_suite.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_kv_backend.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker::testing {
namespace {

// Device copies of the engine's tensors, on the default stream (the backends' stream here).
class DeviceTensor {
 public:
  explicit DeviceTensor(const std::vector<float>& host) : bytes_(host.size() * 4) {
    if (cudaMalloc(&dev_, bytes_) == cudaSuccess) {
      cudaMemcpy(dev_, host.data(), bytes_, cudaMemcpyHostToDevice);
    }
  }
  explicit DeviceTensor(size_t floats) : bytes_(floats * 4) { cudaMalloc(&dev_, bytes_); }
  ~DeviceTensor() { cudaFree(dev_); }
  float* get() const { return static_cast<float*>(dev_); }
  void CopyTo(std::vector<float>* out) const {
    out->resize(bytes_ / 4);
    cudaMemcpy(out->data(), dev_, bytes_, cudaMemcpyDeviceToHost);
  }

 private:
  void* dev_ = nullptr;
  size_t bytes_;
};

class CudaHarness final : public StoreHarness {
 public:
  CudaHarness() {
    if (!::kvtier::testing::NoGpuReason().empty()) return;
    auto backends = cuda::MakeCudaStoreBackends(uint64_t{1} << 28, /*stream=*/nullptr);
    if (backends.ok()) {
      backends_ = *std::move(backends);
    } else {
      error_ = backends.status().ToString();
    }
  }
  std::string Unavailable() const override {
    const std::string why = ::kvtier::testing::NoGpuReason();
    if (!why.empty()) return "no CUDA device: " + why;
    return error_;
  }
  std::unique_ptr<TieredKvStore> MakeStore(const TieredKvStoreOptions& options) override {
    auto backend = backends_->MakeBackend(options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return nullptr;
    auto store = TieredKvStore::Create(
        options, {&backends_->arena(), rig_.ddr.get(), rig_.compressed.get()}, *std::move(backend));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  absl::Status Append(TieredKvStore& store, uint32_t layer, const std::vector<float>& k,
                      const std::vector<float>& v, uint32_t n) override {
    DeviceTensor dk(k), dv(v);
    absl::Status s = store.Append(layer, dk.get(), dv.get(), n);
    cudaDeviceSynchronize();  // the tensors die here
    return s;
  }
  absl::Status Attend(TieredKvStore& store, uint32_t layer, const std::vector<float>& q, uint32_t n,
                      std::vector<float>* out) override {
    DeviceTensor dq(q), dout(q.size());
    absl::Status s = store.Attend(layer, dq.get(), n, dout.get(), nullptr);
    cudaDeviceSynchronize();
    dout.CopyTo(out);
    return s;
  }
  absl::Status AttendBatch(const std::vector<TieredKvStore*>& stores, uint32_t layer,
                           const std::vector<float>& q, std::vector<float>* out) override {
    DeviceTensor dq(q), dout(q.size());
    absl::Status s = TieredKvStore::AttendBatch(stores, layer, dq.get(), dout.get());
    cudaDeviceSynchronize();
    dout.CopyTo(out);
    return s;
  }

 private:
  std::unique_ptr<StoreBackends> backends_;
  std::string error_;
};

INSTANTIATE_TEST_SUITE_P(Cuda, StoreBackendSuite,
                         ::testing::Values(HarnessFactory{
                             "Cuda", [] { return std::make_unique<CudaHarness>(); }}),
                         HarnessName);

double ScoreSum(const TieredSequence& seq) {
  double sum = 0;
  for (float x : seq.scores().TokenScores(0)) sum += x;
  return sum;
}

// One forward pass of n tokens through the sequence, with device tensors.
void Pass(std::mt19937& rng, TieredSequence& seq, uint32_t n) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    DeviceTensor k(RandomVector(rng, n * 192)), v(RandomVector(rng, n * 192));
    DeviceTensor q(RandomVector(rng, n * 576)), out(size_t{n} * 576);
    ASSERT_TRUE(seq.Append(layer, k.get(), v.get(), n).ok());
    ASSERT_TRUE(seq.Attend(layer, q.get(), n, out.get(), nullptr).ok());
    cudaDeviceSynchronize();
  }
}

// The seam with the engine: device pointers in, the cumulative score kept on the device and
// read by the sequence once per re-tiering. Each query's mass is 1 per layer and head, so the
// scores sum to the queries seen up to the last re-tiering.
TEST(CudaSequenceTest, ScoresReachTheHostOncePerRetiering) {
  KVTIER_SKIP_WITHOUT_GPU();
  RuntimeOptions o;
  o.attention = {.num_layers = 2, .num_q_heads = 9, .num_kv_heads = 3, .head_dim = 64};
  o.arena_bytes = 64 << 20;
  o.local_ddr_bytes = 16 << 20;
  o.local_compressed_bytes = 16 << 20;
  o.backend = StoreBackend::kCuda;
  auto runtime = WorkerRuntime::Create(o);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  SequenceOptions so;
  so.policy = "full";
  so.prompt_tokens = 8;
  so.tiering.retier_interval = 4;
  auto seq = (*runtime)->Open(so);
  ASSERT_TRUE(seq.ok()) << seq.status();
  std::mt19937 rng(3);
  Pass(rng, **seq, 8);  // prefill: re-tiers at its end
  EXPECT_NEAR(ScoreSum(**seq), 8.0, 1e-3);
  for (int step = 1; step <= 3; ++step) Pass(rng, **seq, 1);
  EXPECT_NEAR(ScoreSum(**seq), 8.0, 1e-3);  // not read between re-tierings
  Pass(rng, **seq, 1);                      // step 4 re-tiers
  EXPECT_NEAR(ScoreSum(**seq), 12.0, 1e-3);
  std::vector<float> mass(13);
  DeviceTensor q(RandomVector(rng, 576)), out(size_t{576});
  EXPECT_EQ((*seq)->Attend(0, q.get(), 1, out.get(), mass.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Two of SmolLM's layers, f32.
TieredKvStoreOptions TwoLayers() {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.num_q_heads = 9;
  return o;
}

// A store over `backends` (its arena: the HBM budget) and the rig's pools.
absl::StatusOr<std::unique_ptr<TieredKvStore>> StoreIn(StoreBackends& backends, const Rig& rig,
                                                       const TieredKvStoreOptions& o) {
  absl::StatusOr<std::unique_ptr<KvBackend>> backend = backends.MakeBackend(o);
  if (!backend.ok()) return backend.status();
  return TieredKvStore::Create(o, {&backends.arena(), rig.ddr.get(), rig.compressed.get()},
                               *std::move(backend));
}

// The HBM budget (arena_bytes, what the worker reports) holds each store's working memory:
// its staging slots and T2 scratch come from the arena with the T0 pages, within
// StoreWorkingBytes, and a budget without room for them refuses the store, naming the field,
// its value and the bytes asked, and keeps nothing.
TEST(CudaHbmBudgetTest, StagingIsCarvedFromTheArenaAndABudgetWithoutRoomRefusesTheStore) {
  KVTIER_SKIP_WITHOUT_GPU();
  const TieredKvStoreOptions o = TwoLayers();
  const uint64_t block = 2ull * 16 * 3 * 64 * 4;  // one layer of one page, f32
  Rig rig;
  {
    auto backends = cuda::MakeCudaStoreBackends(uint64_t{64} << 20, nullptr);
    ASSERT_TRUE(backends.ok()) << backends.status();
    DeviceArena& arena = (*backends)->arena();
    auto store = StoreIn(**backends, rig, o);
    ASSERT_TRUE(store.ok()) << store.status();
    // Two staging slots of 64 entries, before any page is written.
    EXPECT_GE(arena.used_bytes(), 2 * 64 * block);
    const cuda::StoreWorkingShape shape{.geometry = o.geometry,
                                        .num_q_heads = 9,
                                        .max_tokens = 1024,
                                        .staged_pages = 64,
                                        .t2_codec = &(*store)->codec()};
    EXPECT_LE(arena.used_bytes(), cuda::StoreWorkingBytes(shape));
  }
  const uint64_t budget = 32 * block;  // T0 room for 16 pages, none for a staging slot
  auto small = cuda::MakeCudaStoreBackends(budget, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  auto store = StoreIn(**small, rig, o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(store.status().message(),
              ::testing::AllOf(::testing::HasSubstr("staging slot"),
                               ::testing::HasSubstr(absl::StrCat(64 * block, " bytes")),
                               ::testing::HasSubstr(absl::StrCat("arena_bytes ", budget))))
      << store.status();
  EXPECT_EQ((*small)->arena().used_bytes(), 0u);  // what was taken went back
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A staging area that must grow past what the budget has left (the arena full of other
// sequences' T0 pages) fails the Attend with the budget named, issues no copy and leaves no
// CUDA error behind; once room is back, the same store stages and attends as the full one.
TEST(CudaHbmBudgetTest, AStagingGrowthTheBudgetRefusesFailsTheAttendWithoutACopy) {
  KVTIER_SKIP_WITHOUT_GPU();
  CudaHarness harness;
  ASSERT_EQ(harness.Unavailable(), "");
  const TieredKvStoreOptions o = TwoLayers();
  Rig rig;
  auto backends = cuda::MakeCudaStoreBackends(uint64_t{16} << 20, nullptr);
  ASSERT_TRUE(backends.ok()) << backends.status();
  DeviceArena& arena = (*backends)->arena();
  auto made = StoreIn(**backends, rig, o);
  ASSERT_TRUE(made.ok()) << made.status();
  TieredKvStore& test = **made;
  auto ref = harness.MakeStore(o);  // all in T0
  ASSERT_NE(ref, nullptr);
  std::mt19937 rng(5);
  const uint32_t n = 16 * 70 + 5;  // 71 pages, 70 of them full
  for (uint32_t layer = 0; layer < 2; ++layer) {
    auto k = RandomVector(rng, n * 192), v = RandomVector(rng, n * 192);
    ASSERT_TRUE(harness.Append(test, layer, k, v, n).ok());
    ASSERT_TRUE(harness.Append(*ref, layer, k, v, n).ok());
  }
  std::vector<tiering::Move> plan;  // 70 T1 pages a layer: more than the first 64 staging entries
  for (uint32_t p = 0; p < 70; ++p) plan.push_back({0, p, tiering::Tier::kT0, tiering::Tier::kT1});
  ASSERT_TRUE(test.ApplyPlanLocal(plan, *rig.slots).ok());
  // The rest of the budget goes to others: blocks of every size down to the alignment.
  std::vector<std::pair<uint8_t*, uint64_t>> others;
  for (uint64_t b = arena.capacity_bytes(); b >= 256; b /= 2) {
    for (absl::StatusOr<uint8_t*> p = arena.Allocate(b); p.ok(); p = arena.Allocate(b)) {
      others.emplace_back(*p, b);
    }
  }
  const auto q = RandomVector(rng, 576);
  std::vector<float> out, want;
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second finds no staging area at all
    const absl::Status s = harness.Attend(test, 0, q, 1, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(s.message(), ::testing::AllOf(::testing::HasSubstr("staging slot"),
                                              ::testing::HasSubstr("arena_bytes 16777216")))
        << s;
    EXPECT_EQ(test.stats().staged_h2d_bytes, 0u);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  for (const auto& [p, b] : others) arena.Free(p, b);
  ASSERT_TRUE(harness.Attend(test, 0, q, 1, &out).ok());
  ASSERT_TRUE(harness.Attend(*ref, 0, q, 1, &want).ok());
  EXPECT_GE(test.stats().staged_h2d_bytes, 70u * 2 * 16 * 192 * 4);
  ASSERT_EQ(out.size(), want.size());
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 4));
}

// bf16 pages on the CUDA backend: the engine's f32 rows are stored rounded to nearest even
// (ReadPage widens them back exactly, in every full-precision tier), attention over any T0/T1
// split is bit-identical, and a T2 round trip stays within the 8-bit error plus a bf16 ulp.
TEST(CudaBf16StoreTest, RowsAreRoundedOnceAndEveryTierKeepsThem) {
  KVTIER_SKIP_WITHOUT_GPU();
  CudaHarness harness;
  ASSERT_EQ(harness.Unavailable(), "");
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16);
  o.geometry.num_layers = 2;
  o.geometry.element_bytes = 2;
  o.num_q_heads = 9;
  auto ref = harness.MakeStore(o), test = harness.MakeStore(o);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(test, nullptr);
  EXPECT_EQ(test->SlotBytes(PoolKind::kDdr, 0), 2u * 16 * 3 * 64 * 2 * 2);
  std::mt19937 rng(9);
  const uint32_t n = 16 * 4 + 3;
  std::vector<std::vector<float>> ks;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    auto k = RandomVector(rng, n * 192), v = RandomVector(rng, n * 192);
    for (TieredKvStore* s : {ref.get(), test.get()}) {
      ASSERT_TRUE(harness.Append(*s, layer, k, v, n).ok());
    }
    ks.push_back(k);
  }
  auto rounded = [](float x) {
    return kernels::cuda::Bf16BitsToF32(kernels::cuda::F32ToBf16Bits(x));
  };
  auto check_page1 = [&](const char* where) {
    std::vector<float> page(2 * 2 * 16 * 192);
    ASSERT_TRUE(test->ReadPage(0, 1, page.data()).ok()) << where;
    for (uint32_t layer = 0; layer < 2; ++layer) {
      for (uint32_t i = 0; i < 16 * 192; ++i) {  // K rows of positions 16..31
        ASSERT_EQ(page[layer * 2 * 16 * 192 + i], rounded(ks[layer][16 * 192 + i]))
            << where << " layer " << layer << " i " << i;
      }
    }
  };
  check_page1("T0");
  using tiering::Tier;
  ASSERT_TRUE(test->ApplyPlanLocal({{0, 1, Tier::kT0, Tier::kT1}, {0, 2, Tier::kT0, Tier::kT1}},
                                   harness.slots())
                  .ok());
  check_page1("T1");
  for (int step = 0; step < 3; ++step) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      auto k = RandomVector(rng, 192), v = RandomVector(rng, 192);
      ASSERT_TRUE(harness.Append(*ref, layer, k, v, 1).ok());
      ASSERT_TRUE(harness.Append(*test, layer, k, v, 1).ok());
      const auto q = RandomVector(rng, 576);
      std::vector<float> a, b;
      ASSERT_TRUE(harness.Attend(*ref, layer, q, 1, &a).ok());
      ASSERT_TRUE(harness.Attend(*test, layer, q, 1, &b).ok());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "step " << step;
    }
  }
  ASSERT_TRUE(test->ApplyPlanLocal({{0, 1, Tier::kT1, Tier::kT2}}, harness.slots()).ok());
  ASSERT_TRUE(test->ApplyPlanLocal({{0, 1, Tier::kT2, Tier::kT0}}, harness.slots()).ok());
  std::vector<float> page(2 * 2 * 16 * 192);
  ASSERT_TRUE(test->ReadPage(0, 1, page.data()).ok());
  for (uint32_t i = 0; i < 16 * 192; ++i) {
    ASSERT_NEAR(page[i], ks[0][16 * 192 + i], 0.06f + std::fabs(ks[0][16 * 192 + i]) / 128) << i;
  }
  EXPECT_TRUE(test->IsLossy(0, 1));
  EXPECT_FALSE(test->IsLossy(0, 2));
}

}  // namespace
}  // namespace kvtier::worker::testing
