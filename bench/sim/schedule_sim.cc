// kvtier-schedule-sim: the node-scale picture of prefetch schedules (issue #17,
// docs/scheduling.md). For a host of 8 GPUs behind 2 or 4 PCIe switches, models × batch × context ×
// β: every worker restaging all of its T1 every step ("stage all") against the daemon's schedule
// (link shares from ShareLinks, pages split by SchedulePages into resident / staged / attended in
// place by the CPU). Both run the same core code the daemon does; the cost model's constants are
// printed with the table. No GPU needed: this predicts, it measures nothing.
//
//   kvtier-schedule-sim [--csv FILE]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tiering/schedule.h"

namespace {

using kvtier::tiering::LinkDemand;
using kvtier::tiering::SchedulePage;
using kvtier::tiering::SchedulePages;
using kvtier::tiering::ShareLinks;

// The cost model (DESIGN.md §3), stated so a reader can change it.
constexpr int kGpus = 8;
constexpr double kHbmBytesPerSecond = 4.8e12;    // H200 HBM3e
constexpr double kLinkBytesPerSecond = 55e9;     // PCIe Gen5 x16, effective, host to device
constexpr int kSockets = 2;                      // 4 GPUs per socket (NUMA node)
constexpr double kDdrBytesPerSecond = 215e9;     // per socket: 8 × DDR5-4800 (307 GB/s) × 0.7
constexpr double kCpuAttentionEfficiency = 0.7;  // split attention at 70% of the DDR bound
constexpr double kStagingBytes = 8.0 * (1ull << 30);  // per GPU, HBM kept for resident pages
constexpr double kTurnoverPerRetier = 0.10;           // share of the resident set replaced per Δ
constexpr int kRetierInterval = 64;                   // Δ
constexpr int kPageTokens = 16;

struct Model {
  const char* name;
  double weight_bytes_per_gpu;
  double kv_bytes_per_token_per_gpu;  // K and V, all layers, bf16
};
// 7B: Llama-2-7B geometry (32 layers × 32 KV heads × 128, MHA), one GPU per worker.
// 70B: Llama-2-70B (80 layers × 8 KV heads × 128, GQA), tensor parallel over the 8 GPUs.
const Model kModels[] = {
    {"7B", 13.5e9, 2.0 * 32 * 32 * 128 * 2},
    {"70B TP8", 140e9 / 8, 2.0 * 80 * 8 * 128 * 2 / 8},
};

struct Row {
  std::string model, topology;
  int batch, context;
  double beta;
  double compute_ms;
  double all_pcie_mb, all_step_ms;
  double sched_pcie_mb, sched_step_ms, cpu_share, ddr_gbs;
};

Row Simulate(const Model& m, int switches, int batch, int context, double beta) {
  Row r{m.name, std::to_string(switches) + " switches", batch, context, beta};
  const double live_tokens = static_cast<double>(batch) * context;
  const double t0_bytes = live_tokens * beta * m.kv_bytes_per_token_per_gpu;
  const double t1_bytes = live_tokens * (1 - beta) * m.kv_bytes_per_token_per_gpu;
  const double compute = (m.weight_bytes_per_gpu + t0_bytes) / kHbmBytesPerSecond;
  r.compute_ms = 1e3 * compute;
  std::vector<double> links(switches, kLinkBytesPerSecond);
  auto link_of = [&](int gpu) { return static_cast<uint32_t>(gpu / (kGpus / switches)); };

  // Stage all: every GPU pulls its whole T1 every step; the links and DDR bound the step.
  std::vector<LinkDemand> all(kGpus);
  for (int g = 0; g < kGpus; ++g) all[g] = {link_of(g), t1_bytes / compute};
  const std::vector<double> all_share = *ShareLinks(links, all);
  const double ddr_all = t1_bytes * (kGpus / kSockets) / kDdrBytesPerSecond;
  r.all_pcie_mb = t1_bytes / 1e6;
  r.all_step_ms = 1e3 * std::max({compute, t1_bytes / all_share[0], ddr_all});

  // The schedule: resident pages cost only their turnover; staging gets what hides under the
  // step; the rest is attended by the CPU in DDR.
  const double page_bytes = kPageTokens * m.kv_bytes_per_token_per_gpu;
  const size_t num_pages = static_cast<size_t>(std::ceil(t1_bytes / page_bytes));
  std::vector<SchedulePage> pages(num_pages);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> heat(0, 1);
  for (SchedulePage& p : pages) p = {heat(rng), static_cast<uint64_t>(page_bytes)};
  const double resident_guess = std::min(t1_bytes, kStagingBytes);
  const double churn = resident_guess * kTurnoverPerRetier / kRetierInterval;
  std::vector<LinkDemand> want(kGpus);
  for (int g = 0; g < kGpus; ++g) {
    want[g] = {link_of(g), (t1_bytes - resident_guess + churn) / compute};
  }
  const std::vector<double> share = *ShareLinks(links, want);
  // The socket's DDR serves the staged copies of its 4 GPUs and their CPU attention; the CPU
  // reads what is left at kCpuAttentionEfficiency of it.
  const double gpus_per_socket = kGpus / kSockets;
  const double cpu_rate = kDdrBytesPerSecond * kCpuAttentionEfficiency / gpus_per_socket;
  // The budget: what hides under the step, or, when the rest cannot hide anyway, the split at
  // which the link and the CPU finish together (each path takes bytes in proportion to speed).
  const double rest = std::max(0.0, t1_bytes - kStagingBytes);
  const double budget =
      std::max(share[0] * compute - churn, rest * share[0] / (share[0] + cpu_rate));
  const auto s = SchedulePages(pages, {.staging_bytes = static_cast<uint64_t>(kStagingBytes),
                                       .h2d_bytes_per_step = static_cast<uint64_t>(budget)});
  const double pcie = s.staged_bytes + churn;
  const double cpu = s.in_place_bytes / cpu_rate;
  // DDR is shared by both paths: the copies the link pulls and the CPU's reads.
  const double ddr = gpus_per_socket * (pcie + s.in_place_bytes) / kDdrBytesPerSecond;
  const double step = std::max({compute, pcie / share[0], cpu, ddr});
  r.sched_pcie_mb = pcie / 1e6;
  r.sched_step_ms = 1e3 * step;
  r.cpu_share = t1_bytes > 0 ? s.in_place_bytes / t1_bytes : 0;
  r.ddr_gbs = gpus_per_socket * (pcie + s.in_place_bytes) / step / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const char* csv_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: kvtier-schedule-sim [--csv FILE]\n");
      return 2;
    }
  }
  std::printf(
      "cost model: %d GPUs, HBM %.1f TB/s, PCIe %.0f GB/s per switch uplink, %d sockets of "
      "DDR %.0f GB/s (CPU attention at %.0f%%), staging %.0f GiB per GPU, resident turnover "
      "%.0f%% per %d steps, pages of %d tokens, bf16 KV; compute = (weights + T0 KV) / HBM\n\n",
      kGpus, kHbmBytesPerSecond / 1e12, kLinkBytesPerSecond / 1e9, kSockets,
      kDdrBytesPerSecond / 1e9, 100 * kCpuAttentionEfficiency, kStagingBytes / (1ull << 30),
      100 * kTurnoverPerRetier, kRetierInterval, kPageTokens);
  std::printf(
      "| model | topology | batch | context | β | compute ms | stage all: PCIe MB/step | "
      "step ms | schedule: PCIe MB/step | step ms | T1 on CPU | DDR GB/s per socket | "
      "speedup |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path && !csv) {
    std::fprintf(stderr, "kvtier-schedule-sim: cannot write %s\n", csv_path);
    return 1;
  }
  if (csv) {
    std::fprintf(csv,
                 "model,topology,batch,context,beta,compute_ms,all_pcie_mb,all_step_ms,"
                 "sched_pcie_mb,sched_step_ms,cpu_share,ddr_gbs\n");
  }
  for (const Model& m : kModels) {
    for (int switches : {2, 4}) {
      for (int batch : {1, 8, 32}) {
        for (int context : {4096, 16384, 32768}) {
          for (double beta : {0.25, 0.5}) {
            const Row r = Simulate(m, switches, batch, context, beta);
            std::printf(
                "| %s | %s | %d | %dK | %.2f | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f%% | %.0f | "
                "%.2f× |\n",
                r.model.c_str(), r.topology.c_str(), r.batch, r.context / 1024, r.beta,
                r.compute_ms, r.all_pcie_mb, r.all_step_ms, r.sched_pcie_mb, r.sched_step_ms,
                100 * r.cpu_share, r.ddr_gbs, r.all_step_ms / r.sched_step_ms);
            if (csv) {
              std::fprintf(csv, "%s,%s,%d,%d,%.2f,%.4f,%.3f,%.4f,%.3f,%.4f,%.4f,%.2f\n",
                           r.model.c_str(), r.topology.c_str(), r.batch, r.context, r.beta,
                           r.compute_ms, r.all_pcie_mb, r.all_step_ms, r.sched_pcie_mb,
                           r.sched_step_ms, r.cpu_share, r.ddr_gbs);
            }
          }
        }
      }
    }
  }
  if (csv) std::fclose(csv);
  return 0;
}
