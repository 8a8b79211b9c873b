// Engine throughput on the real model: prefill and decode tokens/s with 1 and 2 threads, and
// the Q4_1 kernel against its scalar baseline (same run). See docs/engine.md for figures.
//
//   build/bin/engine_bench --benchmark_counters_tabular=true

#include <time.h>

#include <filesystem>
#include <memory>
#include <random>

#include "benchmark/benchmark.h"
#include "engine/dense_attention_cache.h"
#include "engine/matmul.h"
#include "engine/model.h"
#include "engine/model_path.h"
#include "engine/sampler.h"

namespace kvtier::engine {
namespace {

Model* GetModel(int threads) {
  static std::unique_ptr<Model> models[3];
  if (models[threads] == nullptr && std::filesystem::exists(DefaultModelPath())) {
    auto m = Model::Load(DefaultModelPath(), ModelOptions{threads});
    if (m.ok()) models[threads] = std::move(*m);
  }
  return models[threads].get();
}

std::vector<int32_t> Tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = 100 + static_cast<int32_t>(i * 7919 % 40000);
  return t;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Prompt of range(1) tokens, fresh cache per iteration.
void BM_Prefill(benchmark::State& state) {
  Model* model = GetModel(static_cast<int>(state.range(0)));
  if (model == nullptr) return state.SkipWithError("model missing: run scripts/install-deps");
  const auto tokens = Tokens(state.range(1));
  std::vector<float> logits;
  double cpu = 0;
  for (auto _ : state) {
    DenseAttentionCache cache(model->attention_shape());
    const double t0 = ThreadCpuSeconds();
    if (!model->Prefill(tokens, cache, &logits).ok()) state.SkipWithError("prefill failed");
    cpu += ThreadCpuSeconds() - t0;
  }
  state.counters["tok/s"] =
      benchmark::Counter(double(tokens.size()) * state.iterations(), benchmark::Counter::kIsRate);
  // Tokens per CPU-second of the calling thread: with 1 thread, about the throughput of an idle
  // core even when other processes share the host.
  state.counters["tok/cpu_s"] = double(tokens.size()) * state.iterations() / cpu;
}

// One decode step per iteration for a batch of range(1) sequences, each with a 64-token prompt
// and at most 128 more positions (caches are reset out of the timed region).
void BM_Decode(benchmark::State& state) {
  Model* model = GetModel(static_cast<int>(state.range(0)));
  if (model == nullptr) return state.SkipWithError("model missing: run scripts/install-deps");
  const size_t batch = state.range(1);
  const auto prompt = Tokens(64);
  std::vector<std::unique_ptr<DenseAttentionCache>> caches(batch);
  std::vector<std::vector<float>> logits(batch);
  auto reset = [&] {
    for (size_t s = 0; s < batch; ++s) {
      caches[s] = std::make_unique<DenseAttentionCache>(model->attention_shape());
      (void)model->Prefill(prompt, *caches[s], &logits[s]);
    }
  };
  reset();
  int steps = 0;
  double cpu = 0;
  for (auto _ : state) {
    if (++steps % 128 == 0) {
      state.PauseTiming();
      reset();
      state.ResumeTiming();
    }
    std::vector<DecodeRequest> reqs;
    for (size_t s = 0; s < batch; ++s) {
      reqs.push_back({Sampler::Argmax(logits[s]), caches[s].get(), &logits[s]});
    }
    const double t0 = ThreadCpuSeconds();
    if (!model->Decode(reqs).ok()) state.SkipWithError("decode failed");
    cpu += ThreadCpuSeconds() - t0;
  }
  state.counters["tok/s"] =
      benchmark::Counter(double(batch) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["tok/cpu_s"] = double(batch) * state.iterations() / cpu;
}

// One 1536×576 Q4_1 matrix-vector product (ffn_up), single thread; range(0): 0 scalar, 1 best.
void BM_MatVecQ4_1(benchmark::State& state) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 1);
  const size_t rows = 1536, cols = 576;
  std::vector<float> w(rows * cols), x(cols), y(rows);
  for (float& v : w) v = dist(rng) * 0.05f;
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> q(rows * cols / 32 * 20);
  QuantizeRowQ4_1(w.data(), q.data(), rows * cols);
  WeightMatrix m{GgmlType::kQ4_1, q.data(), rows, cols, cols / 32 * 20};
  ThreadPool pool(1);
  const KernelIsa isa = state.range(0) == 0 ? KernelIsa::kScalar : DetectKernelIsa();
  state.SetLabel(KernelIsaName(isa));
  for (auto _ : state) {
    MatMul(m, x.data(), 1, y.data(), pool, isa);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(q.size()) * state.iterations());
}

BENCHMARK(BM_MatVecQ4_1)->Arg(0)->Arg(1);
BENCHMARK(BM_Prefill)
    ->ArgNames({"threads", "tokens"})
    ->Args({1, 64})
    ->Args({2, 64})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK(BM_Decode)
    ->ArgNames({"threads", "batch"})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({2, 4})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();

}  // namespace
}  // namespace kvtier::engine
