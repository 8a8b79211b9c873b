// Daemon benchmarks, each against a baseline measured in the same run:
//  - slot allocator: mixed-size alloc/free churn vs malloc/free of the same sizes;
//  - SubmitSnapshot -> TierPlan -> AckPlan in-process at 2K pages per snapshot vs the bare
//    tiering decision + plan diff (core/tiering's Decide + MakePlan) on the same inputs.
// Latency percentiles (thread CPU time) are reported as counters (p50_us, p99_us);
// BM_SnapshotOverhead runs both paths interleaved and reports their p50 ratio directly.
//
//   ninja -C build daemon_bench && build/bin/daemon_bench

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/clock/clock.h"
#include "core/tiering/plan.h"
#include "core/tiering/policy.h"
#include "daemon/daemon_core.h"
#include "daemon/slot_allocator.h"

namespace kvtier::daemon {
namespace {

// Per-iteration latencies are thread CPU time: on a shared, loaded build machine wall time
// mostly measures the scheduler. On an idle machine the two agree (single-threaded path).
struct Clock {
  using time_point = std::chrono::nanoseconds;
  static time_point now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::nanoseconds(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec);
  }
};

constexpr uint32_t kPages = 2048;
constexpr uint32_t kPageTokens = 16;
constexpr uint64_t kLength = uint64_t{kPages} * kPageTokens;
constexpr uint64_t kPrompt = 512;
constexpr int kScoreSets = 16;

void Percentiles(benchmark::State& state, std::vector<double>& us, const char* prefix = "") {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  };
  state.counters[std::string(prefix) + "p50_us"] = at(0.50);
  state.counters[std::string(prefix) + "p99_us"] = at(0.99);
}

const std::vector<uint64_t>& Sizes() {
  static const std::vector<uint64_t> kSizes = {8192, 2560, 61440, 15616, 491520};
  return kSizes;
}

void BM_SlotAllocatorChurn(benchmark::State& state) {
  SlotAllocator a(1ull << 30);
  std::mt19937 rng(1);
  std::vector<Slot> live;
  live.reserve(4096);
  for (int i = 0; i < 2048; ++i) live.push_back(*a.Allocate(Sizes()[rng() % Sizes().size()]));
  for (auto _ : state) {
    size_t i = rng() % live.size();
    live[i] = *a.Allocate(Sizes()[rng() % Sizes().size()]);  // frees the old slot first-in
  }
  state.SetItemsProcessed(state.iterations() * 2);  // one alloc + one free
}
BENCHMARK(BM_SlotAllocatorChurn);

void BM_MallocChurnBaseline(benchmark::State& state) {
  std::mt19937 rng(1);
  std::vector<void*> live;
  for (int i = 0; i < 2048; ++i) live.push_back(std::malloc(Sizes()[rng() % Sizes().size()]));
  for (auto _ : state) {
    size_t i = rng() % live.size();
    std::free(live[i]);
    live[i] = std::malloc(Sizes()[rng() % Sizes().size()]);
    benchmark::DoNotOptimize(live[i]);
  }
  for (void* p : live) std::free(p);
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_MallocChurnBaseline);

std::vector<std::vector<float>> ScoreSets() {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> sets(kScoreSets, std::vector<float>(kPages));
  for (auto& s : sets) {
    for (float& f : s) f = static_cast<float>(rng() % 100000);
  }
  return sets;
}

v1::PolicyConfig BenchPolicy() {
  v1::PolicyConfig p;
  p.set_name("hierarchy");
  p.set_hbm_ratio(0.25);
  p.set_evict_ratio(0.1);
  p.set_compress_ratio(0.2);
  p.set_protect_prompt(true);
  return p;
}

// One worker, one sequence, acking every plan as applied: the steady state of a real daemon.
struct CoreFixture {
  CoreFixture() : metrics(nullptr) {
    CoreOptions o;
    o.ddr_pool_bytes = 64ull << 20;
    o.compressed_pool_bytes = 32ull << 20;
    o.shm_prefix = "/kvtier-bench";
    core = std::move(*DaemonCore::Create(o, &clock, nullptr));
    v1::RegisterWorkerRequest r;
    r.set_worker_name("bench");
    auto* g = r.mutable_geometry();
    g->set_num_layers(4);
    g->set_num_kv_heads(2);
    g->set_head_dim(16);
    g->set_element_bytes(2);
    g->set_page_tokens(kPageTokens);
    g->set_layer_groups(1);
    r.set_t1_page_bytes(8192);
    r.set_t2_page_bytes(2560);
    // As a worker would: a ticket from the memory channel's hello, then the session's secret on
    // every request.
    r.set_channel_ticket(core->Hello({getuid(), getgid(), getpid(), {}})->ticket());
    auto registered = core->RegisterWorker(r);
    worker = registered->worker_id();
    secret = registered->session_secret();
    v1::OpenSequenceRequest open;
    open.set_worker_id(worker);
    open.set_session_secret(secret);
    open.set_prompt_tokens(kPrompt);
    *open.mutable_policy() = BenchPolicy();
    seq = core->OpenSequence(open)->sequence_id();
    tiers.assign(kPages, '\0');
  }
  // Snapshot + ack; returns the snapshot's latency in microseconds.
  double Step(const std::vector<float>& scores) {
    v1::SubmitSnapshotRequest r;
    r.set_worker_id(worker);
    r.set_session_secret(secret);
    r.set_sequence_id(seq);
    r.set_length(kLength);
    r.set_num_pages(kPages);
    r.mutable_page_scores()->Add(scores.begin(), scores.end());
    r.set_current_tiers(tiers);
    r.set_last_plan_version(last_plan);
    auto t0 = Clock::now();
    auto plan = core->SubmitSnapshot(r);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!plan.ok()) std::abort();
    v1::AckPlanRequest ack;
    ack.set_worker_id(worker);
    ack.set_session_secret(secret);
    ack.set_sequence_id(seq);
    ack.set_plan_version(plan->plan_version());
    ack.set_applied(true);
    if (!core->AckPlan(ack).ok()) std::abort();
    tiers = plan->target_tiers();
    last_plan = plan->plan_version();
    moves += plan->move_group_size();
    return us;
  }
  FakeClock clock;
  Metrics* metrics;
  std::unique_ptr<DaemonCore> core;
  uint64_t worker = 0, seq = 0, last_plan = 0, moves = 0;
  std::string secret, tiers;
};

// The baseline: the same decision and diff through core/tiering alone.
struct DecideFixture {
  DecideFixture() {
    tiering::TieringConfig c;
    c.page_tokens = kPageTokens;
    c.budgets = {0.1, 0.25, 0.2};
    policy = std::move(*tiering::MakePolicy("hierarchy", c));
    current = {1, kPages, std::vector<tiering::Tier>(kPages, tiering::Tier::kT0)};
  }
  double Step(const std::vector<float>& scores) {
    auto t0 = Clock::now();
    tiering::DecisionInput in{{kPrompt, kLength}, current, scores};
    auto target = policy->Decide(in);
    auto plan = tiering::MakePlan(current, *target);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(plan->moves.data());
    current = std::move(*target);
    return us;
  }
  std::unique_ptr<tiering::Policy> policy;
  tiering::Placement current;
};

void BM_SubmitSnapshot2KPages(benchmark::State& state) {
  auto sets = ScoreSets();
  CoreFixture f;
  std::vector<double> us;
  int i = 0;
  for (auto _ : state) us.push_back(f.Step(sets[i++ % kScoreSets]));
  state.counters["moves_per_plan"] = static_cast<double>(f.moves) / state.iterations();
  Percentiles(state, us);
  state.SetItemsProcessed(state.iterations() * kPages);
}
BENCHMARK(BM_SubmitSnapshot2KPages)->Unit(benchmark::kMicrosecond);

// Decoding-like scores, as kvtier-bench-daemon's `stable`: each page has a fixed heavy-tailed
// importance and every step adds it with ±20% noise, so rankings drift and plans stay small.
void BM_SubmitSnapshot2KPagesStable(benchmark::State& state) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> importance(kPages), scores(kPages, 0.0f);
  for (float& v : importance) v = 1.0f / (0.01f + unit(rng));
  CoreFixture f;
  std::vector<double> us;
  for (auto _ : state) {
    for (uint32_t p = 0; p < kPages; ++p) {
      if (f.tiers[p] != 3) scores[p] += importance[p] * (0.8f + 0.4f * unit(rng));
    }
    us.push_back(f.Step(scores));
  }
  state.counters["moves_per_plan"] = static_cast<double>(f.moves) / state.iterations();
  Percentiles(state, us);
  state.SetItemsProcessed(state.iterations() * kPages);
}
BENCHMARK(BM_SubmitSnapshot2KPagesStable)->Unit(benchmark::kMicrosecond);

void BM_DecideAndPlanBaseline2KPages(benchmark::State& state) {
  auto sets = ScoreSets();
  DecideFixture f;
  std::vector<double> us;
  int i = 0;
  for (auto _ : state) us.push_back(f.Step(sets[i++ % kScoreSets]));
  Percentiles(state, us);
  state.SetItemsProcessed(state.iterations() * kPages);
}
BENCHMARK(BM_DecideAndPlanBaseline2KPages)->Unit(benchmark::kMicrosecond);

// Both paths interleaved on the same score sets; ratio = daemon p50 / bare-decision p50.
void BM_SnapshotOverhead(benchmark::State& state) {
  auto sets = ScoreSets();
  CoreFixture core;
  DecideFixture bare;
  std::vector<double> a, b;
  int i = 0;
  for (auto _ : state) {
    const auto& s = sets[i++ % kScoreSets];
    a.push_back(core.Step(s));
    b.push_back(bare.Step(s));
  }
  Percentiles(state, a, "daemon_");
  Percentiles(state, b, "bare_");
  state.counters["ratio_p50"] = state.counters["daemon_p50_us"] / state.counters["bare_p50_us"];
  state.counters["ratio_p99"] = state.counters["daemon_p99_us"] / state.counters["bare_p99_us"];
}
BENCHMARK(BM_SnapshotOverhead)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvtier::daemon
