// The runtime end to end in local mode: sequences score, re-tier and keep the zero-error
// property through hundreds of decode steps. One suite, two backends: built as is over the host
// backend, and with KVTIER_TEST_CUDA_BACKEND over the CUDA store (tiered_sequence_cuda_sim_test
// on the simulated device, tiered_sequence_cuda_gpu_test on a real one), where the synthetic
// engine's tensors reach the sequence as device memory (DeviceCache).

#include "worker/runtime/tiered_sequence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/synthetic_engine.h"
#include "worker/runtime/worker_runtime.h"
#ifdef KVTIER_TEST_CUDA_BACKEND
#include "tests/gpu/cuda/gpu_test_util.h"
#include "tests/support/device_cache.h"
#endif

namespace kvtier::worker {
namespace {

using testing::SyntheticEngine;
using tiering::Tier;

#ifdef KVTIER_TEST_CUDA_BACKEND
constexpr StoreBackend kBackend = StoreBackend::kCuda;
constexpr uint32_t kHeadDim = 64;  // the CUDA kernels serve 64 and 128
#define KVTIER_HOST_ONLY(why) GTEST_SKIP() << "host backend only: " << why
#define KVTIER_NEEDS_BACKEND() KVTIER_SKIP_WITHOUT_GPU()
#else
constexpr StoreBackend kBackend = StoreBackend::kHost;
constexpr uint32_t kHeadDim = 32;
#define KVTIER_HOST_ONLY(why) (void)0
#define KVTIER_NEEDS_BACKEND() (void)0
#endif

AttentionShape Shape() {
  return {.num_layers = 4, .num_q_heads = 6, .num_kv_heads = 2, .head_dim = kHeadDim, .scale = 0};
}

std::unique_ptr<WorkerRuntime> LocalRuntime(uint32_t page_tokens) {
  auto r = WorkerRuntime::Create({.attention = Shape(),
                                  .page_tokens = page_tokens,
                                  .arena_bytes = 256 << 20,
                                  .backend = kBackend,
                                  .local_ddr_bytes = 64 << 20,
                                  .local_compressed_bytes = 32 << 20});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

SequenceOptions Options(const std::string& policy, double beta, double r, double gamma,
                        uint64_t prompt) {
  SequenceOptions o;
  o.policy = policy;
  o.prompt_tokens = prompt;
  o.tiering.window_tokens = 32;
  o.tiering.retier_interval = 16;
  o.tiering.budgets = {.evict_ratio = r, .hbm_ratio = beta, .compress_ratio = gamma};
  return o;
}

// Runs prefill + `steps` decode passes on `seq`, returning every attention output.
std::vector<float> Decode(TieredSequence& seq, uint64_t prompt, int steps, uint64_t seed) {
  SyntheticEngine engine(Shape(), seed);
#ifdef KVTIER_TEST_CUDA_BACKEND
  testing::DeviceCache cache(seq, Shape());
#else
  AttentionCache& cache = seq;
#endif
  std::vector<float> out;
  EXPECT_TRUE(engine.Forward(cache, prompt, &out).ok());
  for (int i = 0; i < steps; ++i) {
    absl::Status s = engine.Forward(cache, 1, &out);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  return out;
}

TEST(TieredSequenceTest, HierarchyWithoutLossIsBitIdenticalToFullForEveryHbmRatio) {
  KVTIER_NEEDS_BACKEND();
  std::mt19937 rng(3);
  for (uint32_t page_tokens : {1u, 4u, 16u}) {
    auto runtime = LocalRuntime(page_tokens);
    const uint64_t prompt = 10 + rng() % 30;
    auto full = runtime->Open(Options("full", 1, 0, 0, prompt));
    ASSERT_TRUE(full.ok()) << full.status();
    const std::vector<float> reference = Decode(**full, prompt, 200, page_tokens);
    for (double beta : {0.0, 0.3, 0.7}) {
      auto tiered = runtime->Open(Options("hierarchy", beta, 0, 0, prompt));
      ASSERT_TRUE(tiered.ok()) << tiered.status();
      const std::vector<float> got = Decode(**tiered, prompt, 200, page_tokens);
      ASSERT_EQ(got.size(), reference.size());
      EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)))
          << "page_tokens=" << page_tokens << " beta=" << beta;
      SequenceReport report = (*tiered)->Report();
      if (beta < 0.7) {
        EXPECT_GT(report.offload_bytes, 0u) << "nothing was offloaded: the test proves nothing";
      }
      EXPECT_EQ(report.tokens[static_cast<int>(Tier::kT3)], 0u);
      EXPECT_LT(report.t0_mean_bytes, report.full_mean_bytes + 1);
    }
  }
}

TEST(TieredSequenceTest, EvictionChangesOutputsAndIsReportedCumulatively) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(4);
  auto full = runtime->Open(Options("full", 1, 0, 0, 16));
  auto evicting = runtime->Open(Options("hierarchy", 0.5, 0.2, 0, 16));
  ASSERT_TRUE(full.ok() && evicting.ok());
  const std::vector<float> a = Decode(**full, 16, 250, 11);
  const std::vector<float> b = Decode(**evicting, 16, 250, 11);
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  SequenceReport r = (*evicting)->Report();
  EXPECT_GT(r.tokens[static_cast<int>(Tier::kT3)], 0u);
  // r applies to eligible tokens (generated, not protected): the generated share is below r.
  EXPECT_GT(r.evicted_generated_fraction, 0.0);
  EXPECT_LE(r.evicted_generated_fraction, 0.2 + 1e-9);
  EXPECT_GT(r.plans, 10u);
  EXPECT_EQ(r.length, 16u + 250u);
}

// A shared prefill attention (the evaluation's FanOutCache) is taken only while every page is in
// T0, where the sequence's own kernel would compute the same mass; later it is refused.
TEST(TieredSequenceTest, AttendSharedIsRefusedOnceAPageLeftT0) {
  KVTIER_NEEDS_BACKEND();
  KVTIER_HOST_ONLY("host scores");
  auto runtime = LocalRuntime(4);
  auto seq = runtime->Open(Options("hierarchy", 0.3, 0, 0, 16));
  ASSERT_TRUE(seq.ok()) << seq.status();
  Decode(**seq, 16, 200, 5);
  ASSERT_GT((*seq)->Report().offload_bytes, 0u) << "nothing left T0: the test proves nothing";
  std::vector<float> mass((*seq)->Length(0), 0.f);
  const absl::Status moved = (*seq)->AttendShared(0, 1, mass.data());
  EXPECT_EQ(moved.code(), absl::StatusCode::kFailedPrecondition) << moved;
  EXPECT_NE(moved.message().find("T0"), std::string::npos) << moved;
  EXPECT_EQ((*seq)->AttendShared(Shape().num_layers, 1, mass.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TieredSequenceTest, CompressedPagesCarrySmallBoundedError) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(4);
  auto full = runtime->Open(Options("full", 1, 0, 0, 16));
  auto compressed = runtime->Open(Options("hierarchy", 0.3, 0, 0.5, 16));
  ASSERT_TRUE(full.ok() && compressed.ok());
  const std::vector<float> a = Decode(**full, 16, 150, 5);
  const std::vector<float> b = Decode(**compressed, 16, 150, 5);
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
  EXPECT_GT(max_diff, 0.0);  // T2 is lossy...
  EXPECT_LT(max_diff, 0.1);  // ...but 8-bit close (values are in [-3, 3])
  EXPECT_GT((*compressed)->Report().compress_bytes, 0u);
}

TEST(TieredSequenceTest, LostMassWeighsCompressedPagesByTheirTrueCodecErrorAndEstimatesEvicted) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(4);
  auto full = runtime->Open(Options("full", 1, 0, 0, 16));
  auto compressed = runtime->Open(Options("hierarchy", 0.3, 0, 0.5, 16));
  auto evicting = runtime->Open(Options("hierarchy", 0.5, 0.3, 0, 16));
  auto exact = runtime->Open(Options("hierarchy", 0.3, 0, 0, 16));
  SequenceOptions bounded_options = Options("hierarchy", 0.5, 0.3, 0, 16);
  bounded_options.tiering.budgets.max_lost_mass = 0;
  auto bounded = runtime->Open(bounded_options);
  ASSERT_TRUE(full.ok() && compressed.ok() && evicting.ok() && exact.ok() && bounded.ok());
  for (TieredSequence* s :
       {full->get(), compressed->get(), evicting->get(), exact->get(), bounded->get()}) {
    Decode(*s, 16, 150, 5);  // the same K and V in every sequence
  }
  // The meter's error of each T2 page is the page's true error against the full cache's copy.
  const TieredKvStore& store = (*compressed)->store();
  const uint64_t floats = store.geometry().PageBytes(0) / sizeof(float);
  std::vector<float> want(floats), got(floats);
  int t2_pages = 0;
  for (uint32_t p = 0; p < store.num_pages(); ++p) {
    if (store.TierOf(0, p) != Tier::kT2) continue;
    ++t2_pages;
    ASSERT_TRUE((*full)->store().ReadPage(0, p, want.data()).ok());
    ASSERT_TRUE(store.ReadPage(0, p, got.data()).ok());
    double diff = 0, norm = 0;
    for (uint64_t i = 0; i < floats; ++i) {
      diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      norm += double{want[i]} * want[i];
    }
    const double error = std::sqrt(diff / norm);
    EXPECT_GT(error, 0) << "page " << p;
    EXPECT_NEAR((*compressed)->lost_mass_meter().PageError(0, p), error, 1e-6 + 1e-4 * error)
        << "page " << p;
  }
  EXPECT_GT(t2_pages, 5);
  const SequenceReport c = (*compressed)->Report(), e = (*evicting)->Report();
  EXPECT_GT(c.lost_mass.compressed, 0);
  EXPECT_EQ(c.lost_mass.evicted, 0);
  EXPECT_GT(e.lost_mass.evicted, 0);
  EXPECT_EQ(e.lost_mass.compressed, 0);
  EXPECT_GE(e.lost_mass_peak, e.lost_mass.total());
  EXPECT_EQ((*exact)->Report().lost_mass.total(), 0);
  EXPECT_EQ((*exact)->Report().lost_mass_peak, 0);
  // ε = 0: the same r evicts nothing; the pages r wanted stay live.
  EXPECT_EQ((*bounded)->Report().tokens[static_cast<int>(Tier::kT3)], 0u);
  EXPECT_GT(e.tokens[static_cast<int>(Tier::kT3)], 0u);
}

TEST(TieredSequenceTest, ClosingReturnsEverySlot) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(4);
  {
    auto seq = runtime->Open(Options("hierarchy", 0.2, 0, 0.3, 8));
    ASSERT_TRUE(seq.ok());
    Decode(**seq, 8, 100, 2);
    EXPECT_GT((*seq)->Report().ddr_bytes + (*seq)->Report().compressed_bytes, 0u);
  }
  EXPECT_EQ(runtime->arena().used_bytes(), 0u);
}

TEST(TieredSequenceTest, RejectsWorkerOnlyPoliciesAndBadBudgets) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(16);
  auto h2o = runtime->Open(Options("h2o", 0.5, 0.1, 0, 8));
  EXPECT_EQ(h2o.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = runtime->Open(Options("hierarchy", 1.5, 0, 0, 8));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hbm_ratio"), std::string::npos) << bad.status();
}

// Sequences decoded in one AttendBatch per layer score, re-tier and attend exactly as the same
// sequences decoded one Attend at a time (here with eviction, so placements diverge from full).
TEST(TieredSequenceTest, AttendBatchDecodesAsOneAttendPerSequence) {
  KVTIER_HOST_ONLY("host tensors (the CUDA store suite batches device tensors)");
  auto runtime = LocalRuntime(4);
  const AttentionShape a = Shape();
  const size_t kv_row = size_t{a.num_kv_heads} * a.head_dim,
               q_row = size_t{a.num_q_heads} * a.head_dim;
  std::vector<std::unique_ptr<TieredSequence>> one, batch;
  const std::vector<uint32_t> prompts = {20, 45, 7};
  for (uint32_t prompt : prompts) {
    for (auto* set : {&one, &batch}) {
      auto seq = runtime->Open(Options("hierarchy", 0.4, 0.2, 0, prompt));
      ASSERT_TRUE(seq.ok()) << seq.status();
      set->push_back(*std::move(seq));
    }
  }
  std::vector<TieredSequence*> batched;
  for (auto& s : batch) batched.push_back(s.get());
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  // Prefill one sequence at a time (AttendBatch is for decode steps).
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (uint32_t layer = 0; layer < a.num_layers; ++layer) {
      const uint32_t n = prompts[i];
      const auto k = random(n * kv_row), v = random(n * kv_row), q = random(n * q_row);
      std::vector<float> out(n * q_row);
      for (TieredSequence* seq : {one[i].get(), batch[i].get()}) {
        ASSERT_TRUE(seq->Append(layer, k.data(), v.data(), n).ok());
        ASSERT_TRUE(seq->Attend(layer, q.data(), n, out.data(), nullptr).ok());
      }
    }
  }
  for (int step = 0; step < 120; ++step) {
    for (uint32_t layer = 0; layer < a.num_layers; ++layer) {
      const auto k = random(prompts.size() * kv_row), v = random(prompts.size() * kv_row);
      const auto q = random(prompts.size() * q_row);
      std::vector<float> want(q.size()), got(q.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        for (TieredSequence* seq : {one[i].get(), batch[i].get()}) {
          ASSERT_TRUE(seq->Append(layer, k.data() + i * kv_row, v.data() + i * kv_row, 1).ok());
        }
        ASSERT_TRUE(
            one[i]->Attend(layer, q.data() + i * q_row, 1, want.data() + i * q_row, nullptr).ok());
      }
      absl::Status s = TieredSequence::AttendBatch(batched, layer, q.data(), got.data());
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
          << "step " << step << " layer " << layer;
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(one[i]->store().placement(), batch[i]->store().placement()) << "sequence " << i;
    const SequenceReport ra = one[i]->Report(), rb = batch[i]->Report();
    EXPECT_EQ(ra.plans, rb.plans);
    EXPECT_GT(rb.plans, 5u);
    EXPECT_GT(rb.tokens[static_cast<int>(Tier::kT3)], 0u) << "no eviction: the test proves less";
    EXPECT_GT(rb.offload_bytes, 0u);
  }
  // Bad input names the sequence and attends nothing.
  const std::vector<float> q(2 * q_row);
  std::vector<float> out(q.size());
  absl::Status s = TieredSequence::AttendBatch({batched[0], batched[0]}, 0, q.data(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("sequences[1] is listed twice"), std::string::npos) << s;
  s = TieredSequence::AttendBatch({batched[0], nullptr}, 0, q.data(), out.data());
  EXPECT_NE(std::string(s.message()).find("sequences[1] is null"), std::string::npos) << s;
}

// Rollbacks to random lengths (into pages in T1, below the prompt, mid-page): hierarchy at r 0
// stays bit-identical to full rolled back the same way, and pages leave T0 again afterwards.
TEST(TieredSequenceTest, TruncateKeepsHierarchyBitIdenticalToFull) {
  KVTIER_NEEDS_BACKEND();
  std::mt19937 rng(21);
  for (uint32_t page_tokens : {1u, 4u, 16u}) {
    auto runtime = LocalRuntime(page_tokens);
    const uint64_t prompt = 12 + rng() % 20;
    auto full = runtime->Open(Options("full", 1, 0, 0, prompt));
    auto tiered = runtime->Open(Options("hierarchy", 0.3, 0, 0, prompt));
    ASSERT_TRUE(full.ok() && tiered.ok());
    SyntheticEngine a(Shape(), page_tokens), b(Shape(), page_tokens);
#ifdef KVTIER_TEST_CUDA_BACKEND
    testing::DeviceCache full_cache(**full, Shape()), tiered_cache(**tiered, Shape());
#else
    AttentionCache &full_cache = **full, &tiered_cache = **tiered;
#endif
    std::vector<float> want, got;
    ASSERT_TRUE(a.Forward(full_cache, prompt, &want).ok());
    ASSERT_TRUE(b.Forward(tiered_cache, prompt, &got).ok());
    uint64_t offloaded_before_truncate = 0;
    for (int round = 0; round < 5; ++round) {  // 80 steps, a rollback; 80 steps at the end
      for (int i = 0; i < 80; ++i) {
        ASSERT_TRUE(a.Forward(full_cache, 1, &want).ok());
        ASSERT_TRUE(b.Forward(tiered_cache, 1, &got).ok());
      }
      if (round == 4) break;
      const tiering::Placement before = (*tiered)->store().placement();
      offloaded_before_truncate += std::count(before.tiers.begin(), before.tiers.end(), Tier::kT1);
      const uint32_t length = (*full)->Length(0);
      const uint32_t to = 1 + rng() % (length - 1);
      ASSERT_TRUE((*full)->Truncate(to).ok());
      absl::Status s = (*tiered)->Truncate(to);
      ASSERT_TRUE(s.ok()) << s << " (to " << to << " of " << length << ")";
      ASSERT_EQ((*tiered)->Length(3), to);
      ASSERT_EQ((*tiered)->scores().length(), to);
    }
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << "page_tokens=" << page_tokens;
    EXPECT_GT(offloaded_before_truncate, 0u) << "no page was in T1: the test proves less";
    EXPECT_GT((*tiered)->Report().tokens[static_cast<int>(Tier::kT1)], 0u);
  }
}

TEST(TieredSequenceTest, TruncateDropsPagesInEveryTierAndRefusesSplittingAnEvictedOne) {
  KVTIER_NEEDS_BACKEND();
  auto runtime = LocalRuntime(4);
  {
    auto seq = runtime->Open(Options("hierarchy", 0.3, 0.2, 0.3, 8));
    ASSERT_TRUE(seq.ok()) << seq.status();
    Decode(**seq, 8, 150, 4);
    const tiering::Placement placement = (*seq)->store().placement();
    for (Tier t : {Tier::kT1, Tier::kT2, Tier::kT3}) {
      ASSERT_GT(std::count(placement.tiers.begin(), placement.tiers.end(), t), 0)
          << tiering::TierName(t) << ": the test proves less";
    }
    // Mid-way into an evicted page: refused, nothing changes.
    uint32_t evicted = 0;
    while (placement.at(0, evicted) != Tier::kT3) ++evicted;
    const uint32_t length = (*seq)->Length(0);
    absl::Status s = (*seq)->Truncate(evicted * 4 + 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find("evicted"), std::string::npos) << s;
    EXPECT_EQ((*seq)->Length(0), length);
    EXPECT_EQ((*seq)->store().placement(), placement);
    // Mid-way into a T2 page: it is promoted (appends write T0), the rest dropped.
    uint32_t compressed = 0;
    while (placement.at(0, compressed) != Tier::kT2) ++compressed;
    ASSERT_TRUE((*seq)->Truncate(compressed * 4 + 1).ok());
    EXPECT_EQ((*seq)->store().TierOf(0, compressed), Tier::kT0);
    EXPECT_EQ((*seq)->store().num_pages(), compressed + 1);
    EXPECT_GT((*seq)->Truncate((*seq)->Length(0) + 1).code(), absl::StatusCode::kOk);
    Decode(**seq, 1, 100, 5);  // decodes, scores and re-tiers on
    EXPECT_EQ((*seq)->Length(0), compressed * 4 + 1 + 1 + 100);
  }
  EXPECT_EQ(runtime->arena().used_bytes(), 0u);  // every T0 block of dropped pages came back
}

TEST(TieredSequenceTest, HostRuntimeRefusesBf16KvNamingTheField) {
  KVTIER_HOST_ONLY("bf16 is a CUDA backend format");
  auto r = WorkerRuntime::Create({.attention = Shape(), .kv_element_bytes = 2});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message())
                .find("kv_element_bytes must be 4 (f32), or 2 (bf16) on the CUDA backend, got 2"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace kvtier::worker
