// kvtier-gpu-bench: what the CUDA data plane costs on this GPU.
//
//   1. Copy bandwidth from a pinned shared-memory mapping (the daemon's pool as a worker maps it)
//      against cudaMemcpy from cudaMallocHost memory, both directions.
//   2. Decode tokens/s of a synthetic 7B-class model (28 layers, 28/4 heads, head_dim 128,
//      hidden 3584, ffn 18944, vocab 152064, bf16 weights) on 2K-token chains, batch 1 and 8,
//      its KV cache (f32) in the tiered store over the CUDA backend: `full` against `hierarchy`
//      (beta 0.5, r 0.03, placed by the policy after the first step), and the step-time model
//      max(compute time, T1 bytes / measured H2D bandwidth).
//   3. Bit-identity of `full` and `hierarchy` with r = 0 at this size.
// Prints a markdown report section by section, flushed as each ends (and rewrites --markdown
// after each); a failing section is reported with its error and the run goes on; the exit
// status is 1 when any section failed.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bandwidth.h"
#include "bench/gpu/decode_bench.h"
#include "bench/gpu/section_report.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/gpu_decoder.h"
#include "worker/cuda/synthetic_model.h"

namespace kvtier::bench {
namespace {

using worker::cuda::DecoderOptions;
using worker::cuda::KvMode;
using worker::cuda::SyntheticModel;
using worker::cuda::SyntheticModelConfig;

struct Flags {
  uint32_t context = 2048;
  int warmup = 4;
  int steps = 32;
  double beta = 0.5;
  double evict = 0.03;
  uint32_t retier_interval = 64;
  uint64_t bw_mib = 1024;
  int reps = 5;
  bool small = false;
  std::string markdown;
};

const char* Verdict(bool ok) { return ok ? "**PASS**" : "**FAIL**"; }

std::string DeviceLine() {
  int dev = 0;
  cudaDeviceProp p{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&p, dev);
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  return absl::StrFormat("%s, %d SMs, %.1f GiB, compute %d.%d, runtime %d, driver %d", p.name,
                         p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, p.major, p.minor,
                         rt, drv);
}

// What the sections measured, for the sections after them (unset: that section failed).
struct Figures {
  std::optional<BandwidthResult> bw;
  std::unique_ptr<SyntheticModel> model;
  std::optional<DecodeResult> decode[2][2];  // [batch index][mode]
  std::optional<double> ratio[2], fit[2];
  std::optional<bool> identical;
};

constexpr uint32_t kBatches[2] = {1, 8};

absl::Status NeedsEarlier(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat("needs ", what, ", which failed above"));
}

absl::Status BandwidthSection(const Flags& f, Figures& fig, std::ostream& md) {
  absl::StatusOr<BandwidthResult> bw = MeasureBandwidth(f.bw_mib << 20, f.reps);
  if (!bw.ok()) return bw.status();
  fig.bw = *bw;
  md << "(" << f.bw_mib << " MiB per copy, median of " << f.reps << ")\n\n"
     << "| path | H2D GB/s | D2H GB/s |\n|---|---|---|\n"
     << absl::StrFormat("| pinned %s mapping (cudaHostRegister, 256 MiB chunks) | %.1f | %.1f |\n",
                        bw->pool_kind, bw->shm_h2d_gbps, bw->shm_d2h_gbps)
     << absl::StrFormat("| pinned mapping, 32 KiB blocks, one batched call | %.1f | |\n",
                        bw->shm_h2d_blocks_gbps)
     << absl::StrFormat(
            "| pinned mapping, 32 KiB rows at a 896 KiB pitch, 64 rows a pitched copy (the "
            "stager's copies) | %.1f | |\n",
            bw->shm_h2d_pitched_gbps)
     << absl::StrFormat("| cudaMallocHost (peak) | %.1f | %.1f |\n\n", bw->peak_h2d_gbps,
                        bw->peak_d2h_gbps)
     << absl::StrFormat("Pinning the mapping took %.3f s (%.2f s/GiB).\n\n", bw->pin_seconds,
                        bw->pin_seconds / (f.bw_mib / 1024.0));
  return absl::OkStatus();
}

DecoderOptions Decoder(const Flags& f, uint32_t batch, KvMode mode) {
  DecoderOptions o;
  o.batch = batch;
  o.context_tokens = f.context;
  o.max_new_tokens = f.warmup + f.steps;
  o.mode = mode;
  o.tiering.hbm_ratio = f.beta;
  o.tiering.evict_ratio = f.evict;
  o.tiering.retier_interval = f.retier_interval;
  return o;
}

absl::Status DecodeSection(const Flags& f, Figures& fig, std::ostream& md) {
  SyntheticModelConfig mc = SyntheticModelConfig::SevenBClass();
  if (f.small) {
    mc.num_layers = 4;
    mc.hidden = 512;
    mc.ffn = 1024;
    mc.vocab = 4096;
  }
  absl::StatusOr<std::unique_ptr<SyntheticModel>> model = SyntheticModel::Create(mc);
  if (!model.ok()) return model.status();
  fig.model = *std::move(model);
  md << absl::StrFormat(
      "(synthetic model: %u layers, %u/%u heads, head_dim %u, hidden %u, ffn %u, vocab %u, bf16, "
      "%.2f GB of weights; %u cached tokens per sequence, %d timed steps)\n\n",
      mc.num_layers, mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.hidden, mc.ffn, mc.vocab,
      fig.model->weight_bytes() / 1e9, f.context, f.steps);
  md << "| batch | mode | step ms | tok/s | T0 pages/seq | T1 pages/seq | evicted/seq | T1 MB/step "
        "(H2D) | offloaded MB (D2H, by plans) | plans "
        "|\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (int bi = 0; bi < 2; ++bi) {
    for (KvMode mode : {KvMode::kFull, KvMode::kHierarchy}) {
      const DecoderOptions o = Decoder(f, kBatches[bi], mode);
      absl::StatusOr<DecodeResult> r = RunDecode(*fig.model, o, f.warmup, f.steps);
      if (!r.ok()) {
        return absl::Status(
            r.status().code(),
            absl::StrCat("batch ", o.batch, " ", mode == KvMode::kFull ? "full" : "hierarchy", ": ",
                         r.status().message()));
      }
      fig.decode[bi][static_cast<int>(mode)] = *r;
      const double per_seq = 1.0 / o.batch;
      md << absl::StrFormat("| %u | %s | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %u |\n",
                            o.batch, mode == KvMode::kFull ? "full" : "hierarchy", r->step_ms,
                            r->tokens_per_s, r->stats.t0_pages * per_seq,
                            r->stats.t1_pages * per_seq, r->stats.evicted_pages * per_seq,
                            r->t1_bytes_per_step / 1e6, r->stats.offload_d2h_bytes / 1e6,
                            r->stats.plans);
    }
  }
  md << "\n";
  return absl::OkStatus();
}

// Compute time is the full step (no copies); the copies hide under it while T1 bytes / H2D
// bandwidth stays below it. H2D is the bandwidth of the copies the stager issues (pitched 32 KiB
// rows), measured in the same run, not that of one contiguous copy.
absl::Status StepModelSection(Figures& fig, std::ostream& md) {
  if (!fig.bw) return NeedsEarlier("the copy bandwidth");
  md << "| batch | compute ms (full step) | T1 bytes / H2D ms | model ms | measured ms | "
        "measured / model | hierarchy / full tok/s |\n|---|---|---|---|---|---|---|\n";
  for (int bi = 0; bi < 2; ++bi) {
    if (!fig.decode[bi][0] || !fig.decode[bi][1]) continue;  // the decode section says why
    const DecodeResult& full = *fig.decode[bi][0];
    const DecodeResult& tier = *fig.decode[bi][1];
    const double copy_ms = tier.t1_bytes_per_step / (fig.bw->shm_h2d_pitched_gbps * 1e9) * 1e3;
    const double model_ms = std::max(full.step_ms, copy_ms);
    fig.fit[bi] = tier.step_ms / model_ms;
    fig.ratio[bi] = tier.tokens_per_s / full.tokens_per_s;
    md << absl::StrFormat("| %u | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", kBatches[bi],
                          full.step_ms, copy_ms, model_ms, tier.step_ms, *fig.fit[bi],
                          *fig.ratio[bi]);
  }
  md << "\n";
  if (!fig.fit[0] && !fig.fit[1]) return NeedsEarlier("the decode runs");
  return absl::OkStatus();
}

// r = 0, three steps, batch 1: step 0 runs on T0 alone, its re-tiering offloads, steps 1 and 2
// read T1 pages staged from host memory.
absl::Status BitIdentitySection(const Flags& f, Figures& fig, std::ostream& md) {
  if (fig.model == nullptr) return NeedsEarlier("the model");
  DecoderOptions o = Decoder(f, 1, KvMode::kFull);
  o.max_new_tokens = 3;
  o.tiering.evict_ratio = 0;
  absl::StatusOr<DecodeResult> a = RunDecode(*fig.model, o, 1, 2);
  if (!a.ok()) return a.status();
  o.mode = KvMode::kHierarchy;
  absl::StatusOr<DecodeResult> b = RunDecode(*fig.model, o, 1, 2);
  if (!b.ok()) return b.status();
  if (b->stats.t1_pages == 0 || b->t1_bytes_per_step == 0) {
    return absl::InternalError("hierarchy staged no T1 page: nothing to compare");
  }
  fig.identical = a->logits == b->logits;
  md << absl::StrFormat(
      "full vs hierarchy (r = 0), batch 1, 3 steps (%llu T1 pages staged): logits %s.\n\n",
      static_cast<unsigned long long>(b->stats.t1_pages),
      *fig.identical ? "bit-identical" : "DIFFERENT");
  return absl::OkStatus();
}

// A target whose figure is missing is not met: the run cannot claim it.
void Target(std::ostream& md, const std::string& what, const std::optional<std::string>& figure,
            bool met) {
  md << "| " << what << " | " << figure.value_or("not measured") << " | "
     << Verdict(figure.has_value() && met) << " |\n";
}

absl::Status TargetsSection(const Figures& fig, std::ostream& md) {
  md << "| target | measured | verdict |\n|---|---|---|\n";
  const std::optional<double> h2d =
      fig.bw ? std::optional<double>(fig.bw->shm_h2d_gbps / fig.bw->peak_h2d_gbps) : std::nullopt;
  auto text = [](const std::optional<double>& v, const char* fmt, double scale) {
    return v ? std::optional<std::string>(absl::StrFormat(fmt, *v * scale)) : std::nullopt;
  };
  Target(md, "H2D from the pinned pool >= 90% of cudaMemcpy pinned peak", text(h2d, "%.1f%%", 100),
         h2d.value_or(0) >= 0.90);
  Target(md, "batch 1: hierarchy >= 0.95x full tok/s", text(fig.ratio[0], "%.3fx", 1),
         fig.ratio[0].value_or(0) >= 0.95);
  Target(md, "batch 8: measured step within 10% of max(compute, T1/H2D)",
         text(fig.fit[1], "%.3f", 1), std::fabs(fig.fit[1].value_or(0) - 1) <= 0.10);
  Target(md, "full vs hierarchy (r = 0) logits bit-identical, batch 1, 3 steps",
         fig.identical ? std::optional<std::string>(*fig.identical ? "identical" : "DIFFERENT")
                       : std::nullopt,
         fig.identical.value_or(false));
  md << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kvtier-gpu-bench: copy bandwidth and tiered decode throughput on the GPU"};
  app.add_option("--context", f.context, "tokens already cached per sequence");
  app.add_option("--warmup", f.warmup, "untimed decode steps");
  app.add_option("--steps", f.steps, "timed decode steps");
  app.add_option("--beta", f.beta, "hbm_ratio of the hierarchy policy");
  app.add_option("--evict", f.evict, "evict_ratio of the hierarchy policy");
  app.add_option("--retier-interval", f.retier_interval,
                 "decode steps between re-tierings (the first follows step 0)");
  app.add_option("--bw-mib", f.bw_mib, "bytes per bandwidth copy, MiB");
  app.add_option("--reps", f.reps, "timed copies per bandwidth figure (median)");
  app.add_flag("--small", f.small, "a small model instead of the 7B-class one (smoke runs)");
  app.add_option("--markdown", f.markdown, "also write the report to this file (per section)");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::cerr << "kvtier-gpu-bench: no CUDA device\n";
    return 2;
  }
  SectionReport report(&std::cout, f.markdown);
  report.Preamble(absl::StrCat("## kvtier-gpu-bench\n\nDevice: ", DeviceLine(), "\n\n"));
  Figures fig;
  report.Section("Copy bandwidth", [&](std::ostream& md) { return BandwidthSection(f, fig, md); });
  report.Section("Decode", [&](std::ostream& md) { return DecodeSection(f, fig, md); });
  report.Section("Step-time model: max(compute, T1 bytes / H2D)",
                 [&](std::ostream& md) { return StepModelSection(fig, md); });
  report.Section("Bit-identity at this size",
                 [&](std::ostream& md) { return BitIdentitySection(f, fig, md); });
  report.Section("Targets", [&](std::ostream& md) { return TargetsSection(fig, md); });
  return report.Finish();
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
