// Prefetch schedules and split attention on the CUDA backend (docs/cuda.md, "Schedules and split
// attention"): resident pages stay staged across steps, stage pages are copied in the given
// order within the per-step budget, in-place pages are attended by the CPU from pool memory and
// merged on the device. Each test runs a scheduled store beside an unscheduled one (every page
// staged whole, as before schedules) over the same tokens, plans and queries.
//
// On the simulated device the copy trace also shows which pool bytes were copied, in what
// order; on a GPU the byte counters are checked.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "tests/unit/worker/store_rig.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_kv_backend.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kernels/attention_merge.h"
#include "worker/kernels/cuda/paged_attention.h"
#ifdef KVTIER_CUDA_SIM
#include "worker/cuda/sim/copy_trace.h"
#include "worker/cuda/sim/counters.h"
#endif

namespace kvtier::worker::testing {
namespace {

using ::testing::HasSubstr;
using tiering::Tier;

// The bound the host backend states for split attention (TieredKvStoreSplitTest): within 4e-6
// of the unsplit store, one merge's rounding on outputs that average unit-scale values.
constexpr double kSplitTolerance = 4e-6;
constexpr uint32_t kLayers = 4;  // more layers than staging slots: stage pages are re-copied
constexpr uint32_t kQHeads = 9;

class DeviceTensor {
 public:
  explicit DeviceTensor(const std::vector<float>& host) : bytes_(host.size() * 4) {
    if (cudaMalloc(&dev_, bytes_) == cudaSuccess) {
      cudaMemcpy(dev_, host.data(), bytes_, cudaMemcpyHostToDevice);
    }
  }
  ~DeviceTensor() { cudaFree(dev_); }
  float* get() const { return static_cast<float*>(dev_); }
  std::vector<float> Host() const {
    std::vector<float> out(bytes_ / 4);
    cudaMemcpy(out.data(), dev_, bytes_, cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  void* dev_ = nullptr;
  size_t bytes_;
};

TieredKvStoreOptions Options(uint32_t groups, uint32_t element_bytes) {
  TieredKvStoreOptions o;
  o.geometry = SmolLmGeometry(16, groups);
  o.geometry.num_layers = kLayers;
  o.geometry.element_bytes = element_bytes;
  o.num_q_heads = kQHeads;
  return o;
}

// A reference store (no schedule) and a scheduled one, driven in lockstep.
class Twin {
 public:
  explicit Twin(const TieredKvStoreOptions& o, uint32_t seed) : rng_(seed) {
    auto backends = cuda::MakeCudaStoreBackends(uint64_t{1} << 28, /*stream=*/nullptr);
    EXPECT_TRUE(backends.ok()) << backends.status();
    if (!backends.ok()) return;
    backends_ = *std::move(backends);
    for (auto* s : {&ref_, &test_}) {
      auto backend = backends_->MakeBackend(o);
      EXPECT_TRUE(backend.ok()) << backend.status();
      if (!backend.ok()) return;
      auto store = TieredKvStore::Create(
          o, {&backends_->arena(), rig_.ddr.get(), rig_.compressed.get()}, *std::move(backend));
      EXPECT_TRUE(store.ok()) << store.status();
      if (store.ok()) *s = *std::move(store);
    }
  }
  bool ok() const { return ref_ != nullptr && test_ != nullptr; }
  TieredKvStore& ref() { return *ref_; }
  TieredKvStore& test() { return *test_; }
  std::mt19937& rng() { return rng_; }
  const uint8_t* ddr_base() const { return rig_.ddr->base(); }
  double worst() const { return worst_; }  // largest |ref - test| of an output so far

  // n tokens into both stores, then each layer attended by the last query; the outputs are
  // compared, bit for bit when tolerance is 0.
  void Step(uint32_t n, double tolerance = 0) {
    const layout::KvGeometry& g = ref_->geometry();
    const size_t row = g.ValuesPerTokenLayer(), q_row = size_t{kQHeads} * g.head_dim;
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      DeviceTensor k(RandomVector(rng_, n * row)), v(RandomVector(rng_, n * row));
      DeviceTensor q(RandomVector(rng_, q_row)), out_ref{std::vector<float>(q_row)},
          out_test{std::vector<float>(q_row)};
      ASSERT_TRUE(ref_->Append(layer, k.get(), v.get(), n).ok());
      ASSERT_TRUE(test_->Append(layer, k.get(), v.get(), n).ok());
      ASSERT_TRUE(ref_->Attend(layer, q.get(), 1, out_ref.get(), nullptr).ok());
      absl::Status s = test_->Attend(layer, q.get(), 1, out_test.get(), nullptr);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> a = out_ref.Host(), b = out_test.Host();
      for (size_t i = 0; i < a.size(); ++i) {
        worst_ = std::max(worst_, static_cast<double>(std::fabs(a[i] - b[i])));
        if (tolerance == 0) {
          ASSERT_EQ(a[i], b[i]) << "layer " << layer << " i " << i;
        } else {
          ASSERT_NEAR(a[i], b[i], tolerance) << "layer " << layer << " i " << i;
        }
      }
    }
  }
  // The same moves in both stores (slots from the rig).
  void Apply(const std::vector<tiering::Move>& moves) {
    ASSERT_TRUE(ref_->ApplyPlanLocal(moves, *rig_.slots).ok());
    ASSERT_TRUE(test_->ApplyPlanLocal(moves, *rig_.slots).ok());
  }
  // Each page but the tail moves from T0 to T1 (or T2) with probability `p`.
  void RandomOffload(double p, double t2_share) {
    std::bernoulli_distribution move(p), to_t2(t2_share);
    std::vector<tiering::Move> moves;
    const uint32_t pages = ref_->num_pages();
    for (uint32_t g = 0; g < ref_->geometry().layer_groups; ++g) {
      for (uint32_t page = 0; page + 1 < pages; ++page) {
        if (ref_->TierOf(g, page) == Tier::kT0 && move(rng_)) {
          moves.push_back({g, page, Tier::kT0, to_t2(rng_) ? Tier::kT2 : Tier::kT1});
        }
      }
    }
    Apply(moves);
  }
  // The device scores of both stores, compared.
  void CompareScores(double tolerance) {
    auto a = ref_->TakeDeviceScores(), b = test_->TakeDeviceScores();
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t g = 0; g < a->size(); ++g) {
      for (size_t i = 0; i < (*a)[g].size(); ++i) {
        if (tolerance == 0) {
          ASSERT_EQ((*a)[g][i], (*b)[g][i]) << "group " << g << " position " << i;
        } else {
          ASSERT_NEAR((*a)[g][i], (*b)[g][i], tolerance) << "group " << g << " position " << i;
        }
      }
    }
  }
  // The host pages of each group, T1 and T2.
  std::vector<std::vector<uint32_t>> HostPages() {
    std::vector<std::vector<uint32_t>> out(test_->geometry().layer_groups);
    for (uint32_t g = 0; g < out.size(); ++g) {
      for (uint32_t p = 0; p < test_->num_pages(); ++p) {
        const Tier t = test_->TierOf(g, p);
        if (t == Tier::kT1 || t == Tier::kT2) out[g].push_back(p);
      }
    }
    return out;
  }

 private:
  Rig rig_;
  std::unique_ptr<StoreBackends> backends_;
  std::unique_ptr<TieredKvStore> ref_, test_;
  std::mt19937 rng_;
  double worst_ = 0;
};

// Bytes one page copies host-to-device per step: a layer block per layer of its group.
uint64_t StagedPageBytes(const TieredKvStore& s, uint32_t group) {
  const layout::KvGeometry& g = s.geometry();
  return 2ull * g.page_tokens * g.ValuesPerTokenLayer() * g.element_bytes * g.LayersInGroup(group);
}

// A random schedule over the store's host pages: each page resident, staged or in place, in
// random order; budgets that hold them all.
StageSchedule RandomSchedule(std::mt19937& rng, const TieredKvStore& s,
                             const std::vector<std::vector<uint32_t>>& host, bool in_place) {
  StageSchedule out;
  const uint32_t groups = s.geometry().layer_groups;
  out.resident.resize(groups);
  out.stage.resize(groups);
  out.in_place.resize(groups);
  std::uniform_int_distribution<int> role(0, in_place ? 2 : 1);
  for (uint32_t g = 0; g < groups; ++g) {
    std::vector<uint32_t> pages = host[g];
    std::shuffle(pages.begin(), pages.end(), rng);
    for (uint32_t p : pages) {
      const int r = role(rng);
      (r == 0 ? out.resident : r == 1 ? out.stage : out.in_place)[g].push_back(p);
    }
    out.staging_bytes += StagedPageBytes(s, g) * (out.resident[g].size() + 1);
    out.h2d_bytes_per_step += StagedPageBytes(s, g) * out.stage[g].size();
  }
  return out;
}

class CudaScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override { KVTIER_SKIP_WITHOUT_GPU(); }
};

// With nothing in place, a schedule changes only where staged pages live (resident area or a
// staging slot): the kernel reads the same bytes in the same order, so outputs and device
// scores are those of the unscheduled store, bit for bit.
TEST_F(CudaScheduleTest, WithNothingInPlaceAttentionIsBitIdenticalToFull) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 6; ++trial) {
    const uint32_t groups = 1 + trial % 2, bytes = trial % 3 == 2 ? 2 : 4;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " groups " << groups);
    Twin t(Options(groups, bytes), 100 + trial);
    ASSERT_TRUE(t.ok());
    ASSERT_NO_FATAL_FAILURE(t.Step(16 * 5 + 3));
    for (int step = 0; step < 8; ++step) {
      if (step % 3 == 0) {
        ASSERT_NO_FATAL_FAILURE(t.RandomOffload(0.6, 0.3));
        StageSchedule s = RandomSchedule(rng, t.test(), t.HostPages(), /*in_place=*/false);
        ASSERT_TRUE(t.test().SetSchedule(s).ok());
      }
      ASSERT_NO_FATAL_FAILURE(t.Step(1));
    }
    ASSERT_NO_FATAL_FAILURE(t.CompareScores(0));
    EXPECT_EQ(t.test().stats().split_attends, 0u);
  }
}

// In-place pages attended by the CPU, merged with the device's partial: within the host
// backend's bound of the unsplit store, over random placements (T1 and T2, f32 and bf16) and
// random schedules; the device scores (both partials' mass) within 1e-5.
TEST_F(CudaScheduleTest, SplitAttentionStaysWithinTheHostBackendsBound) {
  std::mt19937 rng(32);
  uint64_t split = 0;
  double worst = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const uint32_t groups = 1 + trial % 2, bytes = trial % 4 == 3 ? 2 : 4;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " groups " << groups << " bytes " << bytes);
    Twin t(Options(groups, bytes), 200 + trial);
    ASSERT_TRUE(t.ok());
    ASSERT_NO_FATAL_FAILURE(t.Step(16 * 6 + 5));
    for (int step = 0; step < 8; ++step) {
      if (step % 4 == 0) {
        ASSERT_NO_FATAL_FAILURE(t.RandomOffload(0.7, 0.3));
        StageSchedule s = RandomSchedule(rng, t.test(), t.HostPages(), /*in_place=*/true);
        ASSERT_TRUE(t.test().SetSchedule(s).ok());
      }
      ASSERT_NO_FATAL_FAILURE(t.Step(1, kSplitTolerance));
    }
    ASSERT_NO_FATAL_FAILURE(t.CompareScores(1e-5));
    split += t.test().stats().split_attends;
    worst = std::max(worst, t.worst());
  }
  EXPECT_GT(split, 100u) << "attention really ran split";
  std::printf("split attends %llu, largest |split - unsplit| of an output %.3g (bound %.0e)\n",
              static_cast<unsigned long long>(split), worst, kSplitTolerance);
}

#ifdef KVTIER_CUDA_SIM
// The DDR pool blocks a trace copied, in issue order, as pool offsets (merged runs cut back into
// blocks). Copies that do not read the pool are left out.
std::vector<uint64_t> PoolBlocks(const std::vector<cudasim::TracedCopy>& trace, const uint8_t* pool,
                                 uint64_t pool_bytes, uint64_t block) {
  std::vector<uint64_t> out;
  for (const cudasim::TracedCopy& c : trace) {
    const auto* src = static_cast<const uint8_t*>(c.src);
    if (src < pool || src >= pool + pool_bytes) continue;
    for (uint64_t off = 0; off < c.bytes; off += block) {
      out.push_back(static_cast<uint64_t>(src - pool) + off);
    }
  }
  return out;
}
#endif

// Resident pages are copied once and stay in the resident area across steps; stage pages are
// copied every step (4 layers over 2 staging slots), in the schedule's order, up to the byte
// budget; the pages past it are attended in place.
TEST_F(CudaScheduleTest, ResidentPagesStayAndStagePagesFollowTheOrderWithinTheBudget) {
  std::mt19937 rng(33);
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    Twin t(Options(1, 4), 300 + trial);
    ASSERT_TRUE(t.ok());
    ASSERT_NO_FATAL_FAILURE(t.Step(16 * 12 + 1));
    std::vector<tiering::Move> moves;
    for (uint32_t p = 0; p < 12; ++p) moves.push_back({0, p, Tier::kT0, Tier::kT1});
    ASSERT_NO_FATAL_FAILURE(t.Apply(moves));
    std::vector<uint32_t> pages(12);
    for (uint32_t p = 0; p < 12; ++p) pages[p] = p;
    std::shuffle(pages.begin(), pages.end(), t.rng());
    const uint32_t resident = 1 + trial, staged = 4 + trial % 3, kept = staged - 1 - trial % 2;
    const uint64_t page = StagedPageBytes(t.test(), 0);
    StageSchedule s;
    s.resident = {{pages.begin(), pages.begin() + resident}};
    s.stage = {{pages.begin() + resident, pages.begin() + resident + staged}};
    s.in_place = {{pages.begin() + resident + staged, pages.end()}};
    s.staging_bytes = page * resident;
    s.h2d_bytes_per_step = page * kept + page / 2;  // `kept` stage pages fit, not one more
    ASSERT_TRUE(t.test().SetSchedule(s).ok());
    const StoreStats before = t.test().stats();
#ifdef KVTIER_CUDA_SIM
    cudasim::StartCopyTrace();
#endif
    const int steps = 5;
    std::vector<uint64_t> staged_per_step;
    for (int step = 0; step < steps; ++step) {
      const uint64_t at = t.test().stats().staged_h2d_bytes;
      ASSERT_NO_FATAL_FAILURE(t.Step(1, kSplitTolerance));
      staged_per_step.push_back(t.test().stats().staged_h2d_bytes - at);
    }
    const StoreStats& after = t.test().stats();
    // Resident: once, in the first step; stage: `kept` pages every step, within the budget (a
    // step's last layer prefetches layer 0 of the next: the first step copies its own layer 0
    // too).
    const uint64_t block = page / kLayers;
    EXPECT_EQ(after.resident_h2d_bytes - before.resident_h2d_bytes, page * resident);
    EXPECT_EQ(staged_per_step[0], page * resident + block * kept * (kLayers + 1));
    for (int step = 1; step < steps; ++step) {
      EXPECT_EQ(staged_per_step[step], page * kept) << "step " << step;
      EXPECT_LE(staged_per_step[step], s.h2d_bytes_per_step);
    }
    EXPECT_EQ(after.split_attends - before.split_attends, uint64_t{steps} * kLayers);
#ifdef KVTIER_CUDA_SIM
    const std::vector<cudasim::TracedCopy> trace = cudasim::TakeCopyTrace();
    cudasim::StopCopyTrace();
    const std::vector<uint64_t> blocks = PoolBlocks(trace, t.ddr_base(), uint64_t{1} << 25, block);
    // The scheduled store's slots, pages 0..11 in page order (HeldSlots' order); the
    // reference store's copies are left out.
    std::map<uint64_t, uint32_t> page_of_slot;
    const std::vector<ReleasedSlot> held = t.test().HeldSlots();
    ASSERT_EQ(held.size(), 12u);
    for (uint32_t p = 0; p < 12; ++p) page_of_slot[held[p].offset] = p;
    // Its copies per (page, layer). Which stage pages are copied follows the schedule's order
    // (the first `kept`); within a layer the stager issues them in source order, as one pitched
    // copy where they are evenly spaced, all waited on before the layer's attention.
    std::map<std::pair<uint32_t, uint32_t>, int> count;
    for (uint64_t at : blocks) {
      auto it = page_of_slot.upper_bound(at);
      if (it == page_of_slot.begin()) continue;
      --it;
      if (at >= it->first + page) continue;  // the reference store's
      const uint32_t layer = static_cast<uint32_t>((at - it->first) / block);
      ++count[{it->second, layer}];
    }
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (uint32_t i = 0; i < resident; ++i) {
        EXPECT_EQ((count[{pages[i], layer}]), 1)
            << "resident page " << pages[i] << " layer " << layer << " copied once in " << steps
            << " steps";
      }
      for (uint32_t i = resident; i < resident + kept; ++i) {
        EXPECT_EQ((count[{pages[i], layer}]), steps + (layer == 0 ? 1 : 0))
            << "stage page " << pages[i] << " layer " << layer;
      }
      for (uint32_t i = resident + kept; i < 12; ++i) {
        EXPECT_EQ((count[{pages[i], layer}]), 0) << "page " << pages[i] << " is attended in place";
      }
    }
#endif
  }
}

// A split decode layer keeps its pinned buffers (the query, the CPU's partial; a ring of two):
// they grow by doubling, so the steps that add a token re-pin nothing (cudaFreeHost waits for
// the device). On the simulated device each split Attend's host waits are counted: after the
// first step every layer makes the same number (the buffer's last upload, the query's download,
// the page-table ring's; no re-pinning of the buffer each step's first layers take).
TEST_F(CudaScheduleTest, SplitDecodeStepsKeepTheirPinnedBuffers) {
  Twin t(Options(1, 4), 77);
  ASSERT_TRUE(t.ok());
  ASSERT_NO_FATAL_FAILURE(t.Step(16 * 12 + 1));
  std::vector<tiering::Move> moves;
  StageSchedule s;
  s.resident = {{}};
  s.stage = {{}};
  s.in_place = {{}};
  for (uint32_t p = 0; p < 12; ++p) {
    moves.push_back({0, p, Tier::kT0, Tier::kT1});
    s.in_place[0].push_back(p);
  }
  s.staging_bytes = StagedPageBytes(t.test(), 0);
  ASSERT_NO_FATAL_FAILURE(t.Apply(moves));
  ASSERT_TRUE(t.test().SetSchedule(s).ok());
  ASSERT_NO_FATAL_FAILURE(t.Step(1, kSplitTolerance));  // pins the buffers
  const uint64_t splits = t.test().stats().split_attends;
  const layout::KvGeometry& g = t.test().geometry();
  const size_t row = g.ValuesPerTokenLayer(), q_row = size_t{kQHeads} * g.head_dim;
  const uint32_t steps = 8;
  std::vector<uint64_t> waits;  // per split Attend, after the first step
  for (uint32_t step = 0; step < steps; ++step) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      DeviceTensor k(RandomVector(t.rng(), row)), v(RandomVector(t.rng(), row));
      DeviceTensor q(RandomVector(t.rng(), q_row)), out{std::vector<float>(q_row)};
      ASSERT_TRUE(t.test().Append(layer, k.get(), v.get(), 1).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#ifdef KVTIER_CUDA_SIM
      const uint64_t before = cudasim::ReadCounters().host_waits;
#endif
      const absl::Status a = t.test().Attend(layer, q.get(), 1, out.get(), nullptr);
      ASSERT_TRUE(a.ok()) << a;
#ifdef KVTIER_CUDA_SIM
      if (step > 0) waits.push_back(cudasim::ReadCounters().host_waits - before);
#endif
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  EXPECT_EQ(t.test().stats().split_attends - splits, uint64_t{steps} * kLayers);
#ifdef KVTIER_CUDA_SIM
  ASSERT_EQ(waits.size(), (steps - 1) * kLayers);
  EXPECT_THAT(waits, ::testing::Each(waits[0]));
#endif
}

// A schedule the device cannot follow is refused with the field, value and limit named, issues
// no copy, and attention goes on unsplit: bit-identical to the unscheduled store.
TEST_F(CudaScheduleTest, ABadScheduleIsRefusedIssuesNothingAndAttentionStaysWhole) {
  Twin t(Options(1, 4), 400);
  ASSERT_TRUE(t.ok());
  ASSERT_NO_FATAL_FAILURE(t.Step(16 * 4 + 2));
  ASSERT_NO_FATAL_FAILURE(t.Apply({{0, 0, Tier::kT0, Tier::kT1}, {0, 1, Tier::kT0, Tier::kT1}}));
  const uint64_t page = StagedPageBytes(t.test(), 0);
  auto schedule = [&](std::vector<uint32_t> resident, std::vector<uint32_t> stage,
                      std::vector<uint32_t> in_place, uint64_t staging, uint64_t h2d) {
    StageSchedule s;
    s.resident = {resident};
    s.stage = {stage};
    s.in_place = {in_place};
    s.staging_bytes = staging;
    s.h2d_bytes_per_step = h2d;
    return s;
  };
  struct Case {
    StageSchedule s;
    std::string says;
  };
  const Case cases[] = {
      {schedule({}, {7}, {0}, page, page), "stage group 0 page 7 does not exist"},
      {schedule({}, {2}, {0}, page, page), "stage group 0 page 2 is in T0"},
      {schedule({0}, {1}, {}, page - 1, page), "staging_bytes " + std::to_string(page - 1) +
                                                   " is below one page staged on the device (" +
                                                   std::to_string(page) + " bytes)"},
      {schedule({}, {1}, {0}, 0, page), "staging_bytes 0 is below one page"},
      {schedule({0, 1}, {}, {}, page, 0), "over staging_bytes " + std::to_string(page)},
      {schedule({0}, {0}, {1}, page, page), "page 0 is listed twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const StoreStats before = t.test().stats();
#ifdef KVTIER_CUDA_SIM
    cudasim::StartCopyTrace();
#endif
    absl::Status s = t.test().SetSchedule(c.s);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#ifdef KVTIER_CUDA_SIM
    EXPECT_TRUE(cudasim::TakeCopyTrace().empty()) << "a refused schedule issued a copy";
    cudasim::StopCopyTrace();
#endif
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
    EXPECT_EQ(t.test().in_place_pages(), 0u);
    ASSERT_NO_FATAL_FAILURE(t.Step(1));  // unsplit: bit-identical
    EXPECT_EQ(t.test().stats().split_attends, before.split_attends);
  }
  ASSERT_NO_FATAL_FAILURE(t.CompareScores(0));
}

// The merge kernel against the worker's CPU merge, and PagedDecodeAttention's lse and per-head
// weights against the CPU kernel's over the same rows.
TEST_F(CudaScheduleTest, TheDeviceMergeIsTheCpuMerge) {
  std::mt19937 rng(35);
  const uint32_t heads = 9, dim = 64, length = 300;
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> out[2], lse[2], mass[2];
    for (int i = 0; i < 2; ++i) {
      out[i] = RandomVector(rng, heads * dim);
      lse[i] = RandomVector(rng, heads);
      mass[i] = RandomVector(rng, heads * length);
      for (float& m : mass[i]) m = std::fabs(m) / length;
    }
    lse[1][trial % heads] = -INFINITY;                  // a head one part did not attend
    if (trial == 4) lse[0][trial % heads] = -INFINITY;  // ... nor the other: zero output
    DeviceTensor d_out0(out[0]), d_out1(out[1]), d_lse0(lse[0]), d_lse1(lse[1]), d_mass0(mass[0]),
        d_mass1(mass[1]), merged{std::vector<float>(heads * dim)},
        position{std::vector<float>(length)};
    kernels::cuda::SplitMergeParams p;
    p.out[0] = d_out0.get();
    p.out[1] = d_out1.get();
    p.lse[0] = d_lse0.get();
    p.lse[1] = d_lse1.get();
    p.head_mass[0] = d_mass0.get();
    p.head_mass[1] = d_mass1.get();
    p.merged = merged.get();
    p.position_mass = position.get();
    p.num_q_heads = heads;
    p.head_dim = dim;
    p.length = length;
    p.mass_stride = length;
    ASSERT_EQ(kernels::cuda::MergeSplitAttention(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> ref_out(heads * dim), ref_mass(length);
    const kernels::AttentionPartial parts[2] = {{out[0].data(), lse[0].data(), mass[0].data()},
                                                {out[1].data(), lse[1].data(), mass[1].data()}};
    kernels::MergeAttentionPartials(parts, {1, heads, dim, length}, ref_out.data(), nullptr,
                                    ref_mass.data());
    const std::vector<float> got = merged.Host(), got_mass = position.Host();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref_out[i], 1e-6 * (1 + std::fabs(ref_out[i]))) << i;
    }
    for (size_t i = 0; i < got_mass.size(); ++i) {
      ASSERT_NEAR(got_mass[i], ref_mass[i], 1e-6 * (1 + std::fabs(ref_mass[i]))) << i;
    }
  }
  // Bad fields: refused, nothing launched.
  kernels::cuda::SplitMergeParams bad;
  EXPECT_EQ(kernels::cuda::MergeSplitAttention(bad, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

}  // namespace
}  // namespace kvtier::worker::testing
