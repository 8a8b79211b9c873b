// kvtier-gpu-bench: what the CUDA data plane costs on this GPU.
//
//   1. Copy bandwidth from a pinned shared-memory mapping (the daemon's pool as a worker maps it)
//      against cudaMemcpy from cudaMallocHost memory, both directions.
//   2. Decode tokens/s of a synthetic 7B-class model (28 layers, 28/4 heads, head_dim 128,
//      hidden 3584, ffn 18944, vocab 152064, bf16) on 2K-token chains, batch 1 and 8, `full`
//      against `hierarchy` (beta 0.5, r 0.03), and the step-time model
//      max(compute time, T1 bytes / measured H2D bandwidth).
//   3. Bit-identity of `full` and `hierarchy` with r = 0 at this size.
// Prints a markdown report (and writes it to --markdown when given).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "bench/gpu/bandwidth.h"
#include "bench/gpu/decode_bench.h"
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
  uint32_t staging_slots = 2;
  uint64_t bw_mib = 1024;
  int reps = 5;
  bool small = false;
  std::string markdown;
};

const char* Verdict(bool ok) { return ok ? "**PASS**" : "**FAIL**"; }

int Fail(const absl::Status& s, const char* what) {
  std::cerr << "kvtier-gpu-bench: " << what << ": " << s << "\n";
  return 1;
}

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

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kvtier-gpu-bench: copy bandwidth and tiered decode throughput on the GPU"};
  app.add_option("--context", f.context, "tokens already cached per sequence");
  app.add_option("--warmup", f.warmup, "untimed decode steps");
  app.add_option("--steps", f.steps, "timed decode steps");
  app.add_option("--beta", f.beta, "hbm_ratio of the hierarchy split");
  app.add_option("--evict", f.evict, "evict_ratio of the hierarchy split");
  app.add_option("--staging-slots", f.staging_slots, "staging slots (2 = double-buffered)");
  app.add_option("--bw-mib", f.bw_mib, "bytes per bandwidth copy, MiB");
  app.add_option("--reps", f.reps, "timed copies per bandwidth figure (median)");
  app.add_flag("--small", f.small, "a small model instead of the 7B-class one (smoke runs)");
  app.add_option("--markdown", f.markdown, "also write the report to this file");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::cerr << "kvtier-gpu-bench: no CUDA device\n";
    return 2;
  }
  std::ostringstream md;
  md << "## kvtier-gpu-bench\n\nDevice: " << DeviceLine() << "\n\n";

  absl::StatusOr<BandwidthResult> bw = MeasureBandwidth(f.bw_mib << 20, f.reps);
  if (!bw.ok()) return Fail(bw.status(), "bandwidth");
  const double h2d_ratio = bw->shm_h2d_gbps / bw->peak_h2d_gbps;
  md << "### Copy bandwidth (" << f.bw_mib << " MiB per copy, median of " << f.reps << ")\n\n"
     << "| path | H2D GB/s | D2H GB/s |\n|---|---|---|\n"
     << absl::StrFormat("| pinned %s mapping (cudaHostRegister, 256 MiB chunks) | %.1f | %.1f |\n",
                        bw->pool_kind, bw->shm_h2d_gbps, bw->shm_d2h_gbps)
     << absl::StrFormat("| pinned mapping, 32 KiB blocks, one batched call | %.1f | |\n",
                        bw->shm_h2d_blocks_gbps)
     << absl::StrFormat("| cudaMallocHost (peak) | %.1f | %.1f |\n\n", bw->peak_h2d_gbps,
                        bw->peak_d2h_gbps)
     << absl::StrFormat("Pinning the mapping took %.3f s (%.2f s/GiB).\n\n", bw->pin_seconds,
                        bw->pin_seconds / (f.bw_mib / 1024.0));

  SyntheticModelConfig mc = SyntheticModelConfig::SevenBClass();
  if (f.small) {
    mc.num_layers = 4;
    mc.hidden = 512;
    mc.ffn = 1024;
    mc.vocab = 4096;
  }
  absl::StatusOr<std::unique_ptr<SyntheticModel>> model = SyntheticModel::Create(mc);
  if (!model.ok()) return Fail(model.status(), "model");
  md << absl::StrFormat(
      "### Decode (synthetic model: %u layers, %u/%u heads, head_dim %u, hidden %u, ffn %u, "
      "vocab %u, bf16, %.2f GB of weights; %u cached tokens per sequence, %d timed steps)\n\n",
      mc.num_layers, mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.hidden, mc.ffn, mc.vocab,
      (*model)->weight_bytes() / 1e9, f.context, f.steps);
  md << "| batch | mode | step ms | tok/s | T0 pages/seq | T1 pages/seq | evicted/seq | T1 MB/step "
        "(H2D) | write-back MB (D2H, whole run) |\n|---|---|---|---|---|---|---|---|---|\n";
  DecodeResult results[2][2];
  const uint32_t batches[2] = {1, 8};
  for (int bi = 0; bi < 2; ++bi) {
    for (KvMode mode : {KvMode::kFull, KvMode::kHierarchy}) {
      DecoderOptions o;
      o.batch = batches[bi];
      o.context_tokens = f.context;
      o.max_new_tokens = f.warmup + f.steps;
      o.mode = mode;
      o.split.hbm_ratio = f.beta;
      o.split.evict_ratio = f.evict;
      o.staging_slots = f.staging_slots;
      absl::StatusOr<DecodeResult> r = RunDecode(**model, o, f.warmup, f.steps);
      if (!r.ok()) return Fail(r.status(), "decode");
      results[bi][static_cast<int>(mode)] = *r;
      md << absl::StrFormat("| %u | %s | %.3f | %.1f | %u | %u | %u | %.1f | %.1f |\n", o.batch,
                            mode == KvMode::kFull ? "full" : "hierarchy", r->step_ms,
                            r->tokens_per_s, r->stats.t0_pages_per_seq, r->stats.t1_pages_per_seq,
                            r->stats.evicted_pages_per_seq, r->t1_bytes_per_step / 1e6,
                            r->stats.write_back_d2h_bytes / 1e6);
    }
  }
  // Step-time model: compute time is the full step (no copies); the copies hide under it while
  // T1 bytes / H2D bandwidth stays below it.
  md << "\n### Step-time model: max(compute, T1 bytes / H2D)\n\n"
     << "| batch | compute ms (full step) | T1 bytes / H2D ms | model ms | measured ms | "
        "measured / model | hierarchy / full tok/s |\n|---|---|---|---|---|---|---|\n";
  double ratio[2], fit[2];
  for (int bi = 0; bi < 2; ++bi) {
    const DecodeResult& full = results[bi][0];
    const DecodeResult& tier = results[bi][1];
    const double copy_ms = tier.t1_bytes_per_step / (bw->shm_h2d_gbps * 1e9) * 1e3;
    const double model_ms = std::max(full.step_ms, copy_ms);
    fit[bi] = tier.step_ms / model_ms;
    ratio[bi] = tier.tokens_per_s / full.tokens_per_s;
    md << absl::StrFormat("| %u | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", batches[bi],
                          full.step_ms, copy_ms, model_ms, tier.step_ms, fit[bi], ratio[bi]);
  }
  // Zero-error check at this size: r = 0, two steps, batch 1.
  DecoderOptions o;
  o.batch = 1;
  o.context_tokens = f.context;
  o.max_new_tokens = 2;
  o.split.hbm_ratio = f.beta;
  o.split.evict_ratio = 0;
  o.mode = KvMode::kFull;
  absl::StatusOr<DecodeResult> a = RunDecode(**model, o, 0, 2);
  o.mode = KvMode::kHierarchy;
  absl::StatusOr<DecodeResult> b = RunDecode(**model, o, 0, 2);
  if (!a.ok() || !b.ok()) return Fail(a.ok() ? b.status() : a.status(), "bit-identity run");
  const bool identical = a->logits == b->logits;

  md << "\n### Targets\n\n| target | measured | verdict |\n|---|---|---|\n"
     << absl::StrFormat(
            "| H2D from the pinned pool >= 90%% of cudaMemcpy pinned peak | %.1f%% | "
            "%s |\n",
            100 * h2d_ratio, Verdict(h2d_ratio >= 0.90))
     << absl::StrFormat("| batch 1: hierarchy >= 0.95x full tok/s | %.3fx | %s |\n", ratio[0],
                        Verdict(ratio[0] >= 0.95))
     << absl::StrFormat(
            "| batch 8: measured step within 10%% of max(compute, T1/H2D) | %.3f | "
            "%s |\n",
            fit[1], Verdict(std::fabs(fit[1] - 1) <= 0.10))
     << absl::StrFormat(
            "| full vs hierarchy (r = 0) logits bit-identical, batch 1, 2 steps | %s "
            "| %s |\n",
            identical ? "identical" : "DIFFERENT", Verdict(identical));
  std::cout << md.str();
  if (!f.markdown.empty()) std::ofstream(f.markdown) << md.str();
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::Main(argc, argv); }
