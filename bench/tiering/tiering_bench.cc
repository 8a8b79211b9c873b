// Time to decide one sequence's tiers (hierarchy, DESIGN.md §2) for 1K…1M tokens at
// page_tokens 1 and 16, by partial selection (nth_element, what the policy runs) and by full
// sort (the comparison), measured in the same run. Counter `per_token` = wall time per
// decision ÷ sequence tokens (seconds, printed with an SI prefix: 11.7n = 11.7 ns/token).
//
//   ninja -C build tiering_bench && build/bench/tiering/tiering_bench

#include <chrono>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/tiering/plan.h"
#include "core/tiering/policy.h"
#include "core/tiering/schedule.h"
#include "core/tiering/selection.h"

namespace kvtier::tiering {
namespace {

constexpr uint64_t kPrompt = 512;
constexpr Budgets kBudgets{.evict_ratio = 0.1, .hbm_ratio = 0.5, .compress_ratio = 0.2};

TieringConfig Config(uint32_t page_tokens) {
  TieringConfig c;
  c.page_tokens = page_tokens;
  c.budgets = kBudgets;
  return c;
}

// A sequence in steady decoding: cumulative scores now, and the placement the previous
// re-tiering left behind 64 tokens earlier, when every score was lower by up to 5% of the
// score range (64 steps of attention added since).
struct Fixture {
  uint64_t length;
  uint32_t pages;
  std::vector<float> scores;
  Placement current;
};

Fixture MakeFixture(uint64_t length, uint32_t page_tokens) {
  Fixture f{.length = length,
            .pages = static_cast<uint32_t>((length + page_tokens - 1) / page_tokens),
            .scores = {},
            .current = {}};
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const uint64_t before = length - 64;
  f.scores.resize(f.pages);
  for (float& x : f.scores) x = u(rng);
  std::vector<float> old(f.scores.begin(),
                         f.scores.begin() + (before + page_tokens - 1) / page_tokens);
  for (float& x : old) x -= 0.05f * u(rng);
  auto policy = MakePolicy("hierarchy", Config(page_tokens));
  Placement empty{.num_groups = 1, .num_pages = 0, .tiers = {}};
  f.current = *(*policy)->Decide({.sequence = {.prompt_tokens = kPrompt, .length = before},
                                  .current = empty,
                                  .page_scores = old});
  return f;
}

void SetCounters(benchmark::State& state, uint64_t tokens) {
  state.counters["tokens"] = static_cast<double>(tokens);
  // Seconds per token, shown with an SI prefix: "11.7n" = 11.7 ns per token.
  state.counters["per_token"] = benchmark::Counter(
      static_cast<double>(tokens),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// SelectGroup alone, with the given ranking method.
void BM_Select(benchmark::State& state, SelectMethod method) {
  const uint64_t length = static_cast<uint64_t>(state.range(0));
  const uint32_t page_tokens = static_cast<uint32_t>(state.range(1));
  Fixture f = MakeFixture(length, page_tokens);
  const TieringConfig config = Config(page_tokens);
  const SequenceState seq{.prompt_tokens = kPrompt, .length = length};
  std::vector<Tier> out(f.pages);
  std::vector<uint64_t> scratch;
  for (auto _ : state) {
    const ProtectedPages prot = HierarchyProtectedPages(config, seq);
    auto stats = SelectGroup(f.scores, f.current.tiers, prot, page_tokens, length, config.budgets,
                             0, absl::MakeSpan(out), &scratch, method);
    benchmark::DoNotOptimize(stats);
    benchmark::DoNotOptimize(out.data());
  }
  SetCounters(state, length);
}

void BM_SelectNthElement(benchmark::State& state) { BM_Select(state, SelectMethod::kNthElement); }
void BM_SelectFullSort(benchmark::State& state) { BM_Select(state, SelectMethod::kFullSort); }

// Policy::Decide alone.
void BM_Decide(benchmark::State& state) {
  const uint64_t length = static_cast<uint64_t>(state.range(0));
  const uint32_t page_tokens = static_cast<uint32_t>(state.range(1));
  Fixture f = MakeFixture(length, page_tokens);
  auto policy = MakePolicy("hierarchy", Config(page_tokens));
  for (auto _ : state) {
    auto target = (*policy)->Decide({.sequence = {.prompt_tokens = kPrompt, .length = length},
                                     .current = f.current,
                                     .page_scores = f.scores});
    benchmark::DoNotOptimize(target);
  }
  SetCounters(state, length);
}

// The whole daemon-side step: Policy::Decide (validation, target allocation) + MakePlan.
void BM_DecideAndPlan(benchmark::State& state) {
  const uint64_t length = static_cast<uint64_t>(state.range(0));
  const uint32_t page_tokens = static_cast<uint32_t>(state.range(1));
  Fixture f = MakeFixture(length, page_tokens);
  auto policy = MakePolicy("hierarchy", Config(page_tokens));
  for (auto _ : state) {
    auto target = (*policy)->Decide({.sequence = {.prompt_tokens = kPrompt, .length = length},
                                     .current = f.current,
                                     .page_scores = f.scores});
    auto plan = MakePlan(f.current, *target);
    benchmark::DoNotOptimize(plan);
  }
  SetCounters(state, length);
}

// What a prefetch schedule adds to a re-tiering (docs/scheduling.md): SchedulePages over the
// target's T1/T2 pages (staging for a tenth of them, a step's budget for a fifth), timed against
// Policy::Decide on the same inputs, interleaved in each iteration. Counter `vs_decide` = the
// schedule's time ÷ the decision's.
void BM_ScheduleVsDecide(benchmark::State& state) {
  using Clock = std::chrono::steady_clock;
  const uint64_t length = static_cast<uint64_t>(state.range(0));
  const uint32_t page_tokens = static_cast<uint32_t>(state.range(1));
  Fixture f = MakeFixture(length, page_tokens);
  auto policy = MakePolicy("hierarchy", Config(page_tokens));
  double decide_s = 0, schedule_s = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto target = (*policy)->Decide({.sequence = {.prompt_tokens = kPrompt, .length = length},
                                     .current = f.current,
                                     .page_scores = f.scores});
    const auto t1 = Clock::now();
    std::vector<SchedulePage> pages;
    for (size_t i = 0; i < target->tiers.size(); ++i) {
      if (target->tiers[i] == Tier::kT1 || target->tiers[i] == Tier::kT2) {
        pages.push_back({f.scores[i], 8192});
      }
    }
    const uint64_t bytes = pages.size() * 8192;
    StepSchedule s =
        SchedulePages(pages, {.staging_bytes = bytes / 10, .h2d_bytes_per_step = bytes / 5});
    benchmark::DoNotOptimize(s);
    const auto t2 = Clock::now();
    decide_s += std::chrono::duration<double>(t1 - t0).count();
    schedule_s += std::chrono::duration<double>(t2 - t1).count();
  }
  state.counters["vs_decide"] = decide_s > 0 ? schedule_s / decide_s : 0;
  SetCounters(state, length);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t page_tokens : {1, 16}) {
    for (int64_t tokens = 1 << 10; tokens <= 1 << 20; tokens <<= 2) {
      b->Args({tokens, page_tokens});
    }
  }
  b->ArgNames({"tokens", "page_tokens"})->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_SelectNthElement)->Apply(Sizes);
BENCHMARK(BM_SelectFullSort)->Apply(Sizes);
BENCHMARK(BM_Decide)->Apply(Sizes);
BENCHMARK(BM_DecideAndPlan)->Apply(Sizes);
BENCHMARK(BM_ScheduleVsDecide)->Apply(Sizes);

}  // namespace
}  // namespace kvtier::tiering
