// Data-plane benchmarks of libkvtier_worker (CPU backend). Every figure is also reported as a
// ratio against a baseline measured in the same process on the same working-set size:
//   pct_of_memcpy  : throughput / memcpy throughput (bytes copied per second)
//   pct_of_bound   : (bytes read / memcpy bandwidth) / measured time  (the brief's bound)
//   pct_of_read_bw : (bytes read / streaming-read bandwidth) / measured time (a tighter bound)
//   mass_share     : (t_with_mass - t_without) / t_with_mass
//
// All times are CPU time: Google Benchmark's CPU column, or thread CPU time fed in as "manual
// time" where the baseline runs interleaved in the same iteration (copies, codecs).
// Run: build/bench/worker/worker_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <vector>

#include "engine/thread_pool.h"
#include "worker/codecs/codec.h"
#include "worker/device_arena.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kernels/attention_merge.h"
#include "worker/page_pool.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {
namespace {

// Thread CPU time: the benchmark machine is shared, so wall time would charge us for other
// processes' time slices. Baselines and benchmarks both use CPU time.
struct Clock {
  using time_point = double;
  static double now() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
  }
};
using tiering::Move;
using tiering::Tier;

double Seconds(double a, double b) { return b - a; }

void FillPseudoRandom(float* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / (1 << 22);
  }
}

// Baseline buffers get the same huge-page advice as the arena and the pools.
struct HugeBuffer {
  explicit HugeBuffer(size_t n, int fill) : size(n) {
    data = static_cast<char*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    madvise(data, n, MADV_HUGEPAGE);
    std::memset(data, fill, n);
  }
  ~HugeBuffer() { munmap(data, size); }
  char* data;
  size_t size;
};

// Bytes/s of memcpy between two distinct buffers of `bytes` (cached per size).
double MemcpyBandwidth(size_t bytes) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  HugeBuffer src(bytes, 1), dst(bytes, 2);
  std::memcpy(dst.data, src.data, bytes);
  size_t done = 0;
  const auto start = Clock::now();
  while (Seconds(start, Clock::now()) < 0.3) {
    std::memcpy(dst.data, src.data, bytes);
    benchmark::DoNotOptimize(dst.data);
    benchmark::ClobberMemory();
    done += bytes;
  }
  return cache[bytes] = done / Seconds(start, Clock::now());
}

// Bytes/s of a streaming read (integer sum) over `bytes` (cached per size).
double ReadBandwidth(size_t bytes) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  HugeBuffer raw(bytes, 3);
  const uint64_t* buf = reinterpret_cast<const uint64_t*>(raw.data);
  size_t done = 0;
  uint64_t sum = 0;
  const auto start = Clock::now();
  while (Seconds(start, Clock::now()) < 0.3) {
    for (size_t i = 0; i < bytes / 8; ++i) sum += buf[i];
    benchmark::DoNotOptimize(sum);
    done += bytes;
  }
  return cache[bytes] = done / Seconds(start, Clock::now());
}

layout::KvGeometry SmolLm(uint32_t layers, uint32_t page_tokens, uint32_t groups) {
  layout::KvGeometry g;
  g.num_layers = layers;
  g.num_kv_heads = 3;
  g.head_dim = 64;
  g.page_tokens = page_tokens;
  g.layer_groups = groups;
  return g;
}

// A store over local host memory filled with `tokens` positions.
struct Bed {
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<HostPagePool> ddr, compressed;
  std::unique_ptr<TieredKvStore> store;

  Bed(const layout::KvGeometry& g, uint32_t tokens, uint64_t pool_bytes) {
    arena = std::make_unique<HostArena>(uint64_t{1} << 36);
    ddr = *HostPagePool::Create(PoolKind::kDdr, pool_bytes);
    compressed = *HostPagePool::Create(PoolKind::kCompressed, pool_bytes);
    TieredKvStoreOptions o;
    o.geometry = g;
    o.num_q_heads = 9;
    store = *TieredKvStore::Create(o, {arena.get(), ddr.get(), compressed.get()});
    const size_t row = g.ValuesPerTokenLayer();
    std::vector<float> k(size_t{tokens} * row), v(k.size());
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      FillPseudoRandom(k.data(), k.size(), 2 * layer);
      FillPseudoRandom(v.data(), v.size(), 2 * layer + 1);
      (void)store->Append(layer, k.data(), v.data(), tokens);
    }
  }
};

// T0 -> T1 -> T0 round trips of every page through ApplyPlan vs memcpy of the same bytes.
// Args: page_tokens, layer_groups.
void BM_PageCopyT0T1(benchmark::State& state) {
  const auto g = SmolLm(30, state.range(0), state.range(1));
  const uint32_t pages = 32 * static_cast<uint32_t>(state.range(1));  // ~24 MB either way
  const uint32_t tokens = pages / g.layer_groups * g.page_tokens;
  const uint64_t slot = (DdrSlotBytes(g, 0) + 255) / 256 * 256 + 256;
  Bed bed(g, tokens, slot * pages + (1 << 20));
  std::vector<Move> out, back;
  std::vector<SlotAssignment> out_slots, back_slots;
  uint64_t bytes = 0;
  for (uint32_t grp = 0; grp < g.layer_groups; ++grp) {
    for (uint32_t p = 0; p < bed.store->num_pages(); ++p) {
      out.push_back({grp, p, Tier::kT0, Tier::kT1});
      back.push_back({grp, p, Tier::kT1, Tier::kT0});
      out_slots.push_back({slot * out_slots.size()});
      back_slots.push_back({0});
      bytes += 2 * DdrSlotBytes(g, grp);
    }
  }
  // The baseline copies the same bytes (A -> B -> A) in the same iteration, so both see the
  // same machine load.
  HugeBuffer a(bytes / 2, 1), b(bytes / 2, 2);
  double op = 0, base = 0;
  for (auto _ : state) {
    const double t0 = Clock::now();
    if (!bed.store->ApplyPlan(out, out_slots).ok()) state.SkipWithError("offload failed");
    if (!bed.store->ApplyPlan(back, back_slots).ok()) state.SkipWithError("promote failed");
    const double t1 = Clock::now();
    std::memcpy(b.data, a.data, bytes / 2);
    std::memcpy(a.data, b.data, bytes / 2);
    benchmark::ClobberMemory();
    const double t2 = Clock::now();
    state.SetIterationTime(t1 - t0);
    op += t1 - t0;
    base += t2 - t1;
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["memcpy_GBps"] = state.iterations() * double(bytes) / base / 1e9;
  state.counters["pct_of_memcpy"] = 100 * base / op;
  state.counters["page_KiB"] = DdrSlotBytes(g, 0) / 1024.0;
}
BENCHMARK(BM_PageCopyT0T1)->Args({16, 1})->Args({16, 30})->Args({1, 30})->UseManualTime();

// Codec throughput in f32 input bytes/s over a working set of SmolLM pages (one layer's K or V
// per call, [16][192]). Args: codec index, 0 = encode / 1 = decode.
void BM_Codec(benchmark::State& state) {
  const codecs::Codec& codec = *(*codecs::FindCodec(codecs::CodecNames()[state.range(0)]));
  const bool decode = state.range(1) == 1;
  constexpr uint32_t kRows = 16, kCols = 192, kTensors = 1024;  // 12 MiB of f32
  const uint64_t in_bytes = uint64_t{kRows} * kCols * 4;
  const uint64_t enc = codec.encoded_bytes(codecs::TensorRole::kKey, kRows, kCols) + 64;
  std::vector<float> f32(size_t{kTensors} * kRows * kCols);
  FillPseudoRandom(f32.data(), f32.size(), 7);
  std::vector<uint8_t> packed(kTensors * enc);
  for (uint32_t t = 0; t < kTensors; ++t) {
    const auto role = t % 2 ? codecs::TensorRole::kValue : codecs::TensorRole::kKey;
    codec.encode(role, f32.data() + size_t{t} * kRows * kCols, kRows, kCols,
                 packed.data() + t * enc);
  }
  std::vector<float> copy(f32.size());
  double op = 0, base = 0;
  for (auto _ : state) {
    const double t0 = Clock::now();
    for (uint32_t t = 0; t < kTensors; ++t) {
      const auto role = t % 2 ? codecs::TensorRole::kValue : codecs::TensorRole::kKey;
      float* x = f32.data() + size_t{t} * kRows * kCols;
      if (decode) {
        codec.decode(role, packed.data() + t * enc, kRows, kCols, x);
      } else {
        codec.encode(role, x, kRows, kCols, packed.data() + t * enc);
      }
    }
    benchmark::ClobberMemory();
    const double t1 = Clock::now();
    std::memcpy(copy.data(), f32.data(), f32.size() * sizeof(float));  // same f32 bytes
    benchmark::ClobberMemory();
    const double t2 = Clock::now();
    state.SetIterationTime(t1 - t0);
    op += t1 - t0;
    base += t2 - t1;
  }
  const double bytes = double(kTensors) * in_bytes;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(codec.name) + (decode ? " decode" : " encode"));
  state.counters["pct_of_memcpy"] = 100 * base / op;
}
BENCHMARK(BM_Codec)->ArgsProduct({{0, 1, 2}, {0, 1}})->UseManualTime();

// Decode attention (n = 1, with position_mass) over `context` positions, SmolLM heads, cycling
// over 8 layers so the KV working set (8 x context x 1.5 KiB) is not cache resident at 16K.
// Args: context, percent of pages offloaded to T1 (read in place: same time expected).
constexpr uint32_t kBenchLayers = 8;

Bed& AttentionBed(uint32_t context) {
  static std::map<uint32_t, std::unique_ptr<Bed>> beds;
  auto& bed = beds[context];
  if (!bed) {
    const auto g = SmolLm(kBenchLayers, 16, 1);
    bed = std::make_unique<Bed>(g, context, DdrSlotBytes(g, 0) * (context / 16 + 2));
  }
  return *bed;
}

void SetT1Share(Bed& bed, int percent) {
  std::vector<Move> moves;
  std::vector<SlotAssignment> slots;
  const uint64_t slot = (DdrSlotBytes(bed.store->geometry(), 0) + 255) / 256 * 256;
  for (uint32_t p = 0; p < bed.store->num_pages(); ++p) {
    const Tier want = (p * 100 / bed.store->num_pages()) % 100 < uint32_t(percent) && p % 2 == 0
                          ? Tier::kT1
                          : Tier::kT0;
    const Tier have = bed.store->TierOf(0, p);
    if (want == have) continue;
    moves.push_back({0, p, have, want});
    slots.push_back({slot * p});
  }
  (void)bed.store->ApplyPlan(moves, slots);
}

void BM_DecodeAttention(benchmark::State& state) {
  const uint32_t context = state.range(0);
  Bed& bed = AttentionBed(context);
  SetT1Share(bed, state.range(1));
  std::vector<float> q(9 * 64), out(9 * 64), mass(context);
  FillPseudoRandom(q.data(), q.size(), 3);
  uint32_t layer = 0;
  for (auto _ : state) {
    (void)bed.store->Attend(layer, q.data(), 1, out.data(), mass.data());
    layer = (layer + 1) % kBenchLayers;
  }
  SetT1Share(bed, 0);
  const double bytes_read = double(context) * 2 * 3 * 64 * 4;  // K and V of one layer
  const size_t ws = size_t(bytes_read) * kBenchLayers;
  state.SetBytesProcessed(state.iterations() * bytes_read);
  state.counters["pct_of_bound"] = benchmark::Counter(
      100 * bytes_read / MemcpyBandwidth(ws), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_of_read_bw"] = benchmark::Counter(
      100 * bytes_read / ReadBandwidth(ws), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeAttention)->ArgsProduct({{1024, 4096, 16384}, {0, 50}});

// The bound measured interleaved with the timed work, at its thread count: a streaming read and
// a memcpy of the same bytes per layer (8 layers cycled, so nothing is cache resident).
using Wall = std::chrono::steady_clock;
double Secs(Wall::time_point a, Wall::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
class SameRunBound {
 public:
  SameRunBound(engine::ThreadPool& pool, size_t bytes)
      : pool_(pool),
        bytes_(bytes),
        read_buf_(bytes * kBenchLayers, 3),
        src_(bytes * kBenchLayers, 1),
        dst_(bytes * kBenchLayers, 2) {}
  void Sample(uint32_t layer) {
    const auto b = Wall::now();
    const uint64_t* words = reinterpret_cast<const uint64_t*>(read_buf_.data + layer * bytes_);
    pool_.ParallelFor(
        bytes_ / 8,
        [&](size_t lo, size_t hi) {
          uint64_t sum = 0;
          for (size_t i = lo; i < hi; ++i) sum += words[i];
          total_.fetch_add(sum, std::memory_order_relaxed);
        },
        4096);
    benchmark::DoNotOptimize(total_);
    const auto c = Wall::now();
    pool_.ParallelFor(
        bytes_,
        [&](size_t lo, size_t hi) {
          std::memcpy(dst_.data + layer * bytes_ + lo, src_.data + layer * bytes_ + lo, hi - lo);
        },
        1 << 15);
    benchmark::ClobberMemory();
    const auto d = Wall::now();
    read_ += Secs(b, c);
    copy_ += Secs(c, d);
  }
  // pct_of_bound = t_memcpy / t_work; pct_of_read_bw = t_read / t_work.
  void Report(benchmark::State& state, double work_seconds) const {
    state.counters["pct_of_bound"] = 100 * copy_ / work_seconds;
    state.counters["pct_of_read_bw"] = 100 * read_ / work_seconds;
    state.counters["read_GBps"] = state.iterations() * double(bytes_) / read_ / 1e9;
  }

 private:
  engine::ThreadPool& pool_;
  size_t bytes_;
  HugeBuffer read_buf_, src_, dst_;
  std::atomic<uint64_t> total_{0};
  double read_ = 0, copy_ = 0;
};

// Split attention's CPU partial (issue #17): one decode query over `context` positions of T1
// rows in pool memory (pages of 16 rows back to back, SmolLM heads, 8 layers cycled so the
// working set is not cache resident), with the log-sum-exp and per-head weights a merge needs,
// plus the merge with a device partial. Against the same-run bounds of BM_DecodeAttention.
void BM_SplitAttentionPartial(benchmark::State& state) {
  const uint32_t context = state.range(0);
  engine::ThreadPool threads(static_cast<int>(state.range(1)));
  constexpr uint32_t kHeads = 9, kKvHeads = 3, kDim = 64;
  const size_t row = size_t{kKvHeads} * kDim;
  static std::map<uint32_t, std::unique_ptr<HugeBuffer>> pools;
  auto& pool = pools[context];
  if (!pool) pool = std::make_unique<HugeBuffer>(size_t{kBenchLayers} * context * 2 * row * 4, 0);
  const float* base = reinterpret_cast<const float*>(pool->data);
  std::vector<std::vector<const float*>> k_rows(kBenchLayers), v_rows(kBenchLayers);
  for (uint32_t l = 0; l < kBenchLayers; ++l) {
    for (uint32_t p = 0; p < context; ++p) {
      // A 16-row page stores its K rows, then its V rows.
      const float* page = base + (size_t{l} * context + p / 16 * 16) * 2 * row;
      k_rows[l].push_back(page + (p % 16) * row);
      v_rows[l].push_back(page + (16 + p % 16) * row);
    }
  }
  std::vector<float> q(kHeads * kDim), out(kHeads * kDim), lse(kHeads);
  std::vector<float> head_mass(size_t{kHeads} * context), mass(context);
  std::vector<float> scratch(kernels::AttentionScratchFloats(kHeads, context));
  std::vector<float> device_out(kHeads * kDim, 0.5f), device_lse(kHeads, 1.f), merged(out.size());
  FillPseudoRandom(q.data(), q.size(), 5);
  kernels::AttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();
  p.head_mass = head_mass.data();
  p.length = context;
  p.num_queries = 1;
  p.num_q_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kDim;
  p.scale = 0.125f;
  p.scratch = scratch.data();
  p.runner = &threads;
  std::vector<float> device_head_mass(head_mass.size(), 0.f);
  SameRunBound bound(threads, context * 2 * row * 4);
  double work = 0;
  uint32_t layer = 0;
  for (auto _ : state) {
    const auto a = Wall::now();
    p.k_rows = k_rows[layer].data();
    p.v_rows = v_rows[layer].data();
    kernels::Attention(p);
    const kernels::AttentionPartial parts[] = {
        {device_out.data(), device_lse.data(), device_head_mass.data()},
        {out.data(), lse.data(), head_mass.data()}};
    kernels::MergeAttentionPartials(parts, {1, kHeads, kDim, context}, merged.data(), nullptr,
                                    mass.data());
    benchmark::DoNotOptimize(mass.data());
    const double t = Secs(a, Wall::now());
    bound.Sample(layer);
    state.SetIterationTime(t);
    work += t;
    layer = (layer + 1) % kBenchLayers;
  }
  state.SetBytesProcessed(state.iterations() * context * 2 * row * 4);
  bound.Report(state, work);
}
BENCHMARK(BM_SplitAttentionPartial)
    ->ArgNames({"context", "threads"})
    ->ArgsProduct({{4096, 16384}, {1, 2}})
    ->UseManualTime();

// Decode attention split over a ThreadPool of range(1) threads, against the same-run bound at
// the same thread count. Each iteration times, in wall time: Attend on one layer (position_mass
// on, half the pages in T1 read in place when range(2) = 50), then the same threads streaming
// the same number of bytes from a buffer of the same working-set size (integer sum), then the
// same threads memcpy-ing that many bytes. Interleaving makes the ratios robust to other load.
//   pct_of_bound   = t_memcpy / t_attend  (bytes / memcpy bandwidth at this thread count)
//   pct_of_read_bw = t_read / t_attend
void BM_DecodeAttentionThreads(benchmark::State& state) {
  const uint32_t context = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  Bed& bed = AttentionBed(context);
  SetT1Share(bed, state.range(2));
  engine::ThreadPool pool(threads);
  bed.store->SetTaskRunner(&pool);
  std::vector<float> q(9 * 64), out(9 * 64), mass(context);
  FillPseudoRandom(q.data(), q.size(), 3);
  const size_t bytes = size_t{context} * 2 * 3 * 64 * 4;  // K and V of one layer
  SameRunBound bound(pool, bytes);
  double att = 0;
  uint32_t layer = 0;
  for (auto _ : state) {
    const auto a = Wall::now();
    (void)bed.store->Attend(layer, q.data(), 1, out.data(), mass.data());
    const double t = Secs(a, Wall::now());
    bound.Sample(layer);
    state.SetIterationTime(t);
    att += t;
    layer = (layer + 1) % kBenchLayers;
  }
  bed.store->SetTaskRunner(nullptr);
  SetT1Share(bed, 0);
  state.SetBytesProcessed(state.iterations() * bytes);
  bound.Report(state, att);
}
BENCHMARK(BM_DecodeAttentionThreads)
    ->ArgNames({"context", "threads", "t1_pct"})
    ->ArgsProduct({{2048, 4096, 8192, 16384}, {1, 2}, {0, 50}})
    ->UseManualTime();

// Share of attention time spent emitting position_mass: with and without, interleaved.
void BM_PositionMassShare(benchmark::State& state) {
  const uint32_t context = state.range(0);
  Bed& bed = AttentionBed(context);
  std::vector<float> q(9 * 64), out(9 * 64), mass(context);
  FillPseudoRandom(q.data(), q.size(), 4);
  double with = 0, without = 0;
  uint32_t layer = 0;
  for (auto _ : state) {
    // Alternate which call goes first so neither always finds the layer's KV in cache.
    const bool mass_first = layer % 2 == 0;
    const auto a = Clock::now();
    (void)bed.store->Attend(layer, q.data(), 1, out.data(), mass_first ? mass.data() : nullptr);
    const auto b = Clock::now();
    (void)bed.store->Attend(layer, q.data(), 1, out.data(), mass_first ? nullptr : mass.data());
    const auto c = Clock::now();
    with += mass_first ? Seconds(a, b) : Seconds(b, c);
    without += mass_first ? Seconds(b, c) : Seconds(a, b);
    ++layer;
    layer %= kBenchLayers;
  }
  state.counters["us_with_mass"] = 1e6 * with / state.iterations();
  state.counters["us_without"] = 1e6 * without / state.iterations();
  state.counters["mass_share_pct"] = 100 * (with - without) / with;
}
BENCHMARK(BM_PositionMassShare)->Arg(1024)->Arg(4096)->Arg(16384);

}  // namespace
}  // namespace kvtier::worker
