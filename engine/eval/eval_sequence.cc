#include "engine/eval/eval_sequence.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "core/tiering/arkv.h"
#include "core/tiering/config.h"
#include "core/tiering/h2o.h"
#include "core/tiering/keep_mask.h"
#include "core/tiering/plan.h"
#include "core/tiering/rkv.h"
#include "core/tiering/snapkv.h"
#include "engine/eval/head_probe.h"
#include "worker/page_pool.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::engine {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr uint32_t kStreamingSinks = 4;  // StreamingLLM's attention sinks

// Peak / mean of T0 and full bytes over forward passes.
struct BytesSeries {
  double t0_peak = 0, full_peak = 0, t0_sum = 0, full_sum = 0, t0_now = 0, full_now = 0;
  uint64_t passes = 0;
  void Add(double t0, double full) {
    t0_now = t0;
    full_now = full;
    t0_peak = std::max(t0_peak, t0);
    full_peak = std::max(full_peak, full);
    t0_sum += t0;
    full_sum += full;
    ++passes;
  }
  void Fill(EvalCost& c) const {
    c.t0_peak_bytes = t0_peak;
    c.full_peak_bytes = full_peak;
    c.t0_mean_bytes = passes ? t0_sum / passes : 0;
    c.full_mean_bytes = passes ? full_sum / passes : 0;
    c.t0_now_bytes = t0_now;
    c.full_now_bytes = full_now;
  }
};

// hierarchy / full through kvtier's runtime.
class RuntimeSequence final : public EvalSequence {
 public:
  explicit RuntimeSequence(std::unique_ptr<worker::TieredSequence> seq) : seq_(std::move(seq)) {}
  worker::AttentionCache& cache() override { return *seq_; }
  absl::Status AfterPrefill() override { return absl::OkStatus(); }
  absl::Status AfterStep() override { return absl::OkStatus(); }
  absl::Status BetweenTurns() override { return seq_->Retier(); }
  EvalCost Cost() const override {
    const worker::SequenceReport r = seq_->Report();
    EvalCost c;
    c.evicted_generated_fraction = r.evicted_generated_fraction;
    c.t0_peak_bytes = r.t0_peak_bytes;
    c.t0_mean_bytes = r.t0_mean_bytes;
    c.full_peak_bytes = r.full_bytes;  // full only grows
    c.full_mean_bytes = r.full_mean_bytes;
    c.t0_now_bytes = r.t0_bytes;
    c.full_now_bytes = r.full_bytes;
    double all = 0;
    for (uint64_t t : r.tokens) all += t;
    c.evicted_fraction = all > 0 ? r.tokens[tiering::kNumTiers - 1] / all : 0;
    c.ddr_bytes = r.ddr_bytes;
    c.compressed_bytes = r.compressed_bytes;
    c.offload_bytes = r.offload_bytes;
    c.compress_bytes = r.compress_bytes;
    c.promote_bytes = r.promote_bytes;
    c.decompress_bytes = r.decompress_bytes;
    c.tier_seconds = r.tier_nanos / 1e9;
    c.lost_mass_peak = r.lost_mass_peak;
    return c;
  }

 private:
  std::unique_ptr<worker::TieredSequence> seq_;
};

// h2o / streaming / rkv: per-(layer, kv head) keep masks over a TieredKvStore.
class MaskSequence final : public EvalSequence {
 public:
  MaskSequence(const EvalConfig& config, const worker::AttentionShape& shape,
               const EvalSequenceOptions& options, uint64_t prompt_tokens,
               std::unique_ptr<worker::TieredKvStore> store, SharedProbeRows* shared_rows)
      : config_(config),
        shape_(shape),
        options_(options),
        prompt_(prompt_tokens),
        store_(std::move(store)),
        probe_(shape, store_.get(), QueryCapacity(config.policy, prompt_tokens)),
        mask_(tiering::KeepMask::AllKept(shape.num_layers, shape.num_kv_heads, 0)) {
    probe_.set_shared_rows(shared_rows);
  }

  absl::Status Init() {
    if (config_.policy == "h2o") {
      ASSIGN_OR_RETURN(tiering::HeadScoreAccumulator acc,
                       tiering::HeadScoreAccumulator::Create(shape_.num_layers, shape_.num_q_heads,
                                                             shape_.num_kv_heads));
      h2o_ = std::make_unique<tiering::HeadScoreAccumulator>(std::move(acc));
    }
    return absl::OkStatus();
  }

  worker::AttentionCache& cache() override { return probe_; }

  absl::Status AfterPrefill() override {
    const auto t = Clock::now();
    if (h2o_ != nullptr) {
      // H2O seeds its scores with the prompt's attention column sums.
      std::vector<float> sums;
      probe_.ColumnSums(sums);
      RETURN_IF_ERROR(h2o_->SeedPrefill(sums, probe_.Length(0)));
      probe_.set_query_capacity(1);
    }
    RETURN_IF_ERROR(Retier());
    if (config_.policy == "rkv") probe_.set_query_capacity(8);
    if (config_.policy == "snapkv") probe_.set_query_capacity(1);
    seconds_ += Since(t);
    Account();
    return absl::OkStatus();
  }

  absl::Status AfterStep() override {
    const auto t = Clock::now();
    ++step_;
    if (h2o_ != nullptr) {
      probe_.ComputeRows(1, rows_);
      RETURN_IF_ERROR(h2o_->AddStep(rows_, probe_.Length(0)));
    }
    if (step_ % options_.retier_interval == 0 && config_.policy != "snapkv") {
      RETURN_IF_ERROR(Retier());
    }
    seconds_ += Since(t);
    Account();
    return absl::OkStatus();
  }

  // SnapKV compresses the prompt once; the others re-select at the new length.
  absl::Status BetweenTurns() override {
    if (config_.policy == "snapkv") return absl::OkStatus();
    const auto t = Clock::now();
    RETURN_IF_ERROR(Retier());
    seconds_ += Since(t);
    return absl::OkStatus();
  }

  EvalCost Cost() const override {
    EvalCost c;
    series_.Fill(c);
    const uint64_t L = probe_.Length(0);
    uint64_t evicted = 0;
    for (uint32_t l = 0; l < shape_.num_layers; ++l) {
      for (uint32_t h = 0; h < shape_.num_kv_heads; ++h) {
        for (uint64_t p = prompt_; p < mask_.length; ++p) evicted += !mask_.Kept(l, h, p);
      }
    }
    const double generated = double(L - prompt_) * shape_.num_layers * shape_.num_kv_heads;
    c.evicted_generated_fraction = generated > 0 ? evicted / generated : 0;
    uint64_t dropped = 0;
    for (uint8_t k : mask_.keep) dropped += !k;
    const double all = double(L) * shape_.num_layers * shape_.num_kv_heads;
    c.evicted_fraction = all > 0 ? dropped / all : 0;
    c.tier_seconds = seconds_;
    return c;
  }

 private:
  static uint32_t QueryCapacity(const std::string& policy, uint64_t prompt) {
    if (policy == "h2o") return static_cast<uint32_t>(prompt);  // prefill column sums
    if (policy == "snapkv") return tiering::SnapKvConfig{}.window;
    return policy == "rkv" ? 8 : 1;
  }

  absl::StatusOr<tiering::KeepMask> Select() {
    const uint64_t L = probe_.Length(0);
    const uint64_t budget = std::max<uint64_t>(1, tiering::CeilRatio(config_.hbm_ratio, L));
    if (config_.policy == "h2o") {
      tiering::H2oConfig c;
      c.heavy_tokens = budget / 2;
      c.recent_tokens = budget - budget / 2;
      return tiering::H2oSelect(*h2o_, mask_, {.prompt_tokens = prompt_, .length = L}, c);
    }
    if (config_.policy == "streaming") {
      tiering::KeepMask next = mask_.Extended(L);
      const uint64_t sinks = std::min<uint64_t>(kStreamingSinks, budget);
      const uint64_t recent_from = L - std::min<uint64_t>(L, budget - sinks);
      for (uint32_t l = 0; l < shape_.num_layers; ++l) {
        for (uint32_t h = 0; h < shape_.num_kv_heads; ++h) {
          for (uint64_t p = sinks; p < recent_from; ++p) next.keep[next.Index(l, h, p)] = 0;
        }
      }
      return next;
    }
    if (config_.policy == "snapkv") {
      const uint32_t queries = std::min<uint32_t>(probe_.stored_queries(), L);
      probe_.ComputeRows(queries, rows_);
      tiering::SnapKvConfig c;
      c.budget_tokens = budget;
      return tiering::SnapKvSelect({.num_layers = shape_.num_layers,
                                    .num_q_heads = shape_.num_q_heads,
                                    .num_kv_heads = shape_.num_kv_heads,
                                    .length = L,
                                    .queries = queries,
                                    .attention = rows_},
                                   c);
    }
    tiering::RkvConfig c;  // rkv
    c.budget_tokens = std::max<uint64_t>(budget, c.alpha);
    const uint32_t queries = std::min<uint32_t>(probe_.stored_queries(), c.alpha);
    probe_.ComputeRows(queries, rows_);
    probe_.KeysByHead(keys_);
    tiering::RkvInput in{.num_layers = shape_.num_layers,
                         .num_q_heads = shape_.num_q_heads,
                         .num_kv_heads = shape_.num_kv_heads,
                         .head_dim = shape_.head_dim,
                         .prompt_tokens = prompt_,
                         .length = L,
                         .queries = queries,
                         .attention = rows_,
                         .keys = keys_};
    return tiering::RkvCompress(in, mask_, c);
  }

  absl::Status Retier() {
    ASSIGN_OR_RETURN(tiering::KeepMask next, Select());
    for (uint32_t l = 0; l < shape_.num_layers; ++l) {
      for (uint32_t h = 0; h < shape_.num_kv_heads; ++h) {
        for (uint64_t p = 0; p < next.length; ++p) {
          const bool was = p >= mask_.length || mask_.Kept(l, h, p);
          if (was && !next.Kept(l, h, p)) {
            RETURN_IF_ERROR(store_->SetKeep(l, h, static_cast<uint32_t>(p), false));
            probe_.Drop(l, h, static_cast<uint32_t>(p));
          }
        }
      }
    }
    mask_ = std::move(next);
    return absl::OkStatus();
  }

  void Account() {
    const uint64_t L = probe_.Length(0);
    uint64_t kept = (L - mask_.length) * shape_.num_layers * shape_.num_kv_heads;
    for (uint8_t k : mask_.keep) kept += k;
    const double per = 2.0 * shape_.head_dim * 4;  // K and V, f32
    series_.Add(kept * per, double(L) * shape_.num_layers * shape_.num_kv_heads * per);
  }

  EvalConfig config_;
  worker::AttentionShape shape_;
  EvalSequenceOptions options_;
  uint64_t prompt_;
  std::unique_ptr<worker::TieredKvStore> store_;
  HeadProbeCache probe_;
  tiering::KeepMask mask_;
  std::unique_ptr<tiering::HeadScoreAccumulator> h2o_;
  std::vector<float> rows_, keys_;
  uint64_t step_ = 0;
  double seconds_ = 0;
  BytesSeries series_;
};

// arkv: one layer group per layer, tri-state placement applied through plans.
class ArkvSequence final : public EvalSequence {
 public:
  ArkvSequence(const EvalConfig& config, const worker::AttentionShape& shape,
               const EvalSequenceOptions& options, uint64_t prompt_tokens,
               std::unique_ptr<worker::HostPagePool> ddr,
               std::unique_ptr<worker::HostPagePool> compressed,
               std::unique_ptr<worker::LocalSlotAllocator> slots,
               std::unique_ptr<worker::TieredKvStore> store, SharedProbeRows* shared_rows)
      : config_(config),
        shape_(shape),
        options_(options),
        prompt_(prompt_tokens),
        ddr_(std::move(ddr)),
        compressed_(std::move(compressed)),
        slots_(std::move(slots)),
        store_(std::move(store)),
        probe_(shape, store_.get(), arkv_.observation_window) {
    probe_.set_shared_rows(shared_rows);
  }

  worker::AttentionCache& cache() override { return probe_; }

  absl::Status AfterPrefill() override {
    const auto t = Clock::now();
    const uint32_t rows = probe_.stored_queries();
    const uint64_t L = probe_.Length(0);
    probe_.ComputeRows(rows, rows_);
    std::vector<tiering::ArkvLayerStats> stats;
    const size_t per_layer = size_t{shape_.num_q_heads} * rows * L;
    for (uint32_t l = 0; l < shape_.num_layers; ++l) {
      ASSIGN_OR_RETURN(
          tiering::ArkvLayerStats s,
          tiering::ArkvPrefillStats(absl::MakeConstSpan(rows_.data() + l * per_layer, per_layer),
                                    shape_.num_q_heads, rows, L));
      stats.push_back(s);
    }
    ASSIGN_OR_RETURN(ratios_, tiering::ArkvOqRatios(stats, arkv_));
    RETURN_IF_ERROR(Retier(rows));
    probe_.set_query_capacity(1);
    seconds_ += Since(t);
    Account();
    return absl::OkStatus();
  }

  absl::Status AfterStep() override {
    const auto t = Clock::now();
    ++step_;
    if (step_ % options_.retier_interval == 0) {
      probe_.ComputeRows(1, rows_);
      RETURN_IF_ERROR(Retier(1));
    }
    seconds_ += Since(t);
    Account();
    return absl::OkStatus();
  }

  absl::Status BetweenTurns() override {
    const auto t = Clock::now();
    probe_.ComputeRows(std::min<uint32_t>(1, probe_.stored_queries()), rows_);
    RETURN_IF_ERROR(Retier(std::min<uint32_t>(1, probe_.stored_queries())));
    seconds_ += Since(t);
    return absl::OkStatus();
  }

  EvalCost Cost() const override {
    EvalCost c;
    series_.Fill(c);
    const tiering::Placement p = store_->placement();
    const layout::KvGeometry& g = store_->geometry();
    const uint64_t L = probe_.Length(0);
    uint64_t evicted = 0;
    for (uint32_t grp = 0; grp < p.num_groups; ++grp) {
      for (uint32_t page = 0; page < p.num_pages; ++page) {
        const tiering::Tier tier = p.at(grp, page);
        if (tier == tiering::Tier::kT2) {
          c.compressed_bytes += worker::CompressedSlotBytes(store_->codec(), g, grp);
        } else if (tier == tiering::Tier::kT1) {
          c.ddr_bytes += worker::DdrSlotBytes(g, grp);
        } else if (tier == tiering::Tier::kT3) {
          const uint64_t b = uint64_t{page} * g.page_tokens, e = b + g.page_tokens;
          evicted += std::min(e, L) - std::min(std::max(b, prompt_), std::min(e, L));
        }
      }
    }
    const double generated = double(L - prompt_) * p.num_groups;
    c.evicted_generated_fraction = generated > 0 ? evicted / generated : 0;
    uint64_t t3 = 0;
    for (uint32_t grp = 0; grp < p.num_groups; ++grp) {
      for (uint32_t page = 0; page < p.num_pages; ++page) {
        if (p.at(grp, page) != tiering::Tier::kT3) continue;
        const uint64_t b = uint64_t{page} * g.page_tokens;
        t3 += std::min<uint64_t>(b + g.page_tokens, L) - std::min<uint64_t>(b, L);
      }
    }
    c.evicted_fraction = L > 0 ? double(t3) / (double(L) * p.num_groups) : 0;
    const auto& m = store_->stats().move_bytes;
    using tiering::Tier;
    const auto at = [&](Tier a, Tier b) { return m[int(a)][int(b)]; };
    c.offload_bytes = at(Tier::kT0, Tier::kT1);
    c.compress_bytes = at(Tier::kT0, Tier::kT2) + at(Tier::kT1, Tier::kT2);
    c.promote_bytes = at(Tier::kT1, Tier::kT0) + at(Tier::kT2, Tier::kT0);
    c.decompress_bytes = at(Tier::kT2, Tier::kT1);
    c.tier_seconds = seconds_;
    return c;
  }

 private:
  absl::Status Retier(uint32_t queries) {
    const uint64_t L = probe_.Length(0);
    const uint32_t H = shape_.num_q_heads, kvh = shape_.num_kv_heads;
    const size_t per_layer = size_t{H} * queries * L;
    std::vector<float> page_scores;
    for (uint32_t l = 0; l < shape_.num_layers; ++l) {
      ASSIGN_OR_RETURN(std::vector<float> heads,
                       tiering::ArkvHeavyHitterScores(
                           absl::MakeConstSpan(rows_.data() + l * per_layer, per_layer), H, kvh,
                           queries, L, arkv_));
      ASSIGN_OR_RETURN(
          std::vector<float> pages,
          tiering::ArkvLayerPageScores(heads, kvh, L, options_.page_tokens, tiering::kSum));
      page_scores.insert(page_scores.end(), pages.begin(), pages.end());
    }
    tiering::TieringConfig config;
    config.page_tokens = options_.page_tokens;
    config.retier_interval = options_.retier_interval;
    config.window_tokens = options_.window_tokens;
    config.sink_tokens = options_.sink_tokens;
    config.protect_prompt = options_.protect_prompt;
    config.budgets.evict_ratio = config_.evict_ratio;
    config.budgets.hbm_ratio = 1.0;
    const tiering::Placement current = store_->placement();
    ASSIGN_OR_RETURN(tiering::Decision d,
                     tiering::ArkvDecide({.sequence = {.prompt_tokens = prompt_, .length = L},
                                          .current = current,
                                          .page_scores = page_scores,
                                          .oq_ratios = ratios_},
                                         config, arkv_));
    ASSIGN_OR_RETURN(tiering::Plan plan, tiering::MakePlan(current, d.placement));
    RETURN_IF_ERROR(store_->ApplyPlanLocal(plan.moves, *slots_));
    for (const tiering::Move& move : plan.moves) {
      if (move.to != tiering::Tier::kT3) continue;
      const uint64_t b = uint64_t{move.page} * options_.page_tokens;
      for (uint64_t p = b; p < std::min(L, b + options_.page_tokens); ++p) {
        for (uint32_t h = 0; h < kvh; ++h) probe_.Drop(move.group, h, static_cast<uint32_t>(p));
      }
    }
    return absl::OkStatus();
  }

  void Account() {
    const tiering::Placement p = store_->placement();
    const layout::KvGeometry& g = store_->geometry();
    double t0 = 0, full = 0;
    for (uint32_t grp = 0; grp < p.num_groups; ++grp) {
      for (uint32_t page = 0; page < p.num_pages; ++page) {
        full += g.PageBytes(grp);
        if (p.at(grp, page) == tiering::Tier::kT0) t0 += g.PageBytes(grp);
      }
    }
    series_.Add(t0, full);
  }

  EvalConfig config_;
  worker::AttentionShape shape_;
  EvalSequenceOptions options_;
  uint64_t prompt_;
  tiering::ArkvConfig arkv_;
  std::unique_ptr<worker::HostPagePool> ddr_, compressed_;
  std::unique_ptr<worker::LocalSlotAllocator> slots_;
  std::unique_ptr<worker::TieredKvStore> store_;
  HeadProbeCache probe_;
  std::vector<double> ratios_;
  std::vector<float> rows_;
  uint64_t step_ = 0;
  double seconds_ = 0;
  BytesSeries series_;
};

}  // namespace

absl::StatusOr<worker::WorkerRuntime*> EvalContext::Runtime(const std::string& codec) {
  auto it = runtimes_.find(codec);
  if (it != runtimes_.end()) return it->second.get();
  worker::RuntimeOptions o;
  o.attention = shape_;
  o.page_tokens = options_.page_tokens;
  o.codec = codec;
  o.worker_name = "kvtier-eval";
  o.arena_bytes = 64ull << 30;  // nominal caps: memory is taken as pages are written
  o.local_ddr_bytes = 16ull << 30;
  o.local_compressed_bytes = 8ull << 30;
  ASSIGN_OR_RETURN(auto runtime, worker::WorkerRuntime::Create(o));
  worker::WorkerRuntime* raw = runtime.get();
  runtimes_[codec] = std::move(runtime);
  return raw;
}

absl::StatusOr<std::unique_ptr<EvalSequence>> EvalContext::Open(const EvalConfig& config,
                                                                uint64_t prompt_tokens,
                                                                uint64_t protected_prompt_begin) {
  if (config.policy == "full" || config.policy == "hierarchy") {
    ASSIGN_OR_RETURN(worker::WorkerRuntime * runtime, Runtime(config.codec));
    worker::SequenceOptions o;
    o.policy = config.policy;
    o.prompt_tokens = prompt_tokens;
    o.protected_prompt_begin = protected_prompt_begin;
    o.tag = "kvtier-eval";
    o.tiering.retier_interval = options_.retier_interval;
    o.tiering.window_tokens = options_.window_tokens;
    o.tiering.sink_tokens = options_.sink_tokens;
    o.tiering.protect_prompt = options_.protect_prompt;
    o.tiering.budgets = {.evict_ratio = config.evict_ratio,
                         .hbm_ratio = config.hbm_ratio,
                         .compress_ratio = config.compress_ratio,
                         .max_lost_mass = config.max_lost_mass};
    ASSIGN_OR_RETURN(auto seq, runtime->Open(o));
    return std::make_unique<RuntimeSequence>(std::move(seq));
  }
  layout::KvGeometry geometry{.num_layers = shape_.num_layers,
                              .num_kv_heads = shape_.num_kv_heads,
                              .head_dim = shape_.head_dim,
                              .element_bytes = 4,
                              .page_tokens = options_.page_tokens,
                              .layer_groups = 1};
  worker::TieredKvStoreOptions store_options{.geometry = geometry,
                                             .num_q_heads = shape_.num_q_heads,
                                             .scale = shape_.scale,
                                             .codec = config.codec};
  if (config.policy == "h2o" || config.policy == "streaming" || config.policy == "rkv" ||
      config.policy == "snapkv") {
    store_options.keep_mask = true;
    ASSIGN_OR_RETURN(auto store, worker::TieredKvStore::Create(store_options, {&arena_}));
    auto seq = std::make_unique<MaskSequence>(config, shape_, options_, prompt_tokens,
                                              std::move(store), &shared_rows_);
    RETURN_IF_ERROR(seq->Init());
    return seq;
  }
  if (config.policy == "arkv") {
    store_options.geometry.layer_groups = shape_.num_layers;
    constexpr uint64_t kPool = 1ull << 30;  // mapped lazily
    ASSIGN_OR_RETURN(auto ddr, worker::HostPagePool::Create(worker::PoolKind::kDdr, kPool));
    ASSIGN_OR_RETURN(auto comp, worker::HostPagePool::Create(worker::PoolKind::kCompressed, kPool));
    auto slots = std::make_unique<worker::LocalSlotAllocator>(
        std::vector<worker::LocalSlotAllocator::PoolSpec>{{worker::PoolKind::kDdr, kPool},
                                                          {worker::PoolKind::kCompressed, kPool}});
    ASSIGN_OR_RETURN(
        auto store, worker::TieredKvStore::Create(store_options, {&arena_, ddr.get(), comp.get()}));
    return std::make_unique<ArkvSequence>(config, shape_, options_, prompt_tokens, std::move(ddr),
                                          std::move(comp), std::move(slots), std::move(store),
                                          &shared_rows_);
  }
  return absl::InvalidArgumentError(absl::StrCat("policy \"", config.policy, "\" is unknown"));
}

}  // namespace kvtier::engine
