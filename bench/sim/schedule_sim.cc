// kvtier-schedule-sim: the node-scale picture of prefetch schedules (issue #17,
// docs/scheduling.md). For a host of 8 GPUs behind 2 or 4 PCIe switches, models × batch × context ×
// β: every worker restaging all of its T1 every step ("stage all") against the daemon's schedule
// (link shares from ShareLinks, pages split by SchedulePages into resident / staged / attended in
// place by the CPU). Both run the same core code the daemon does; the cost model's constants are
// printed with the table. No GPU needed: this predicts, it measures nothing.
//
//   kvtier-schedule-sim [--csv FILE]

#include <cstdio>
#include <cstring>
#include <string>

#include "core/planning/step_model.h"

namespace {

using kvtier::planning::GpuLoad;
using kvtier::planning::HostModel;
using kvtier::planning::PredictStep;
using kvtier::planning::StepPrediction;

// The cost model (DESIGN.md §3) is core/planning/step_model.h's: HostModel's defaults are this
// table's host (8 H200s, 2 sockets, 8 GiB of staging per GPU); the topology varies below.
constexpr int kGpus = 8;
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
  double compute_ms, all_in_hbm_ms;
  double all_pcie_mb, all_step_ms;
  double sched_pcie_mb, sched_step_ms, cpu_share, ddr_gbs;
};

Row Simulate(const Model& m, int switches, int batch, int context, double beta) {
  Row r{m.name, std::to_string(switches) + " switches", batch, context, beta};
  const double live_tokens = static_cast<double>(batch) * context;
  HostModel host;
  host.gpus = kGpus;
  host.gpus_per_link = kGpus / switches;
  const StepPrediction p =
      PredictStep(host, GpuLoad{.weight_bytes = m.weight_bytes_per_gpu,
                                .t0_bytes = live_tokens * beta * m.kv_bytes_per_token_per_gpu,
                                .t1_bytes = live_tokens * (1 - beta) * m.kv_bytes_per_token_per_gpu,
                                .t1_page_bytes = kPageTokens * m.kv_bytes_per_token_per_gpu});
  r.compute_ms = 1e3 * p.compute_seconds;
  r.all_in_hbm_ms = 1e3 * (m.weight_bytes_per_gpu + live_tokens * m.kv_bytes_per_token_per_gpu) /
                    host.hbm_bytes_per_second;
  r.all_pcie_mb = p.stage_all_pcie_bytes / 1e6;
  r.all_step_ms = 1e3 * p.stage_all_seconds;
  r.sched_pcie_mb = p.schedule_pcie_bytes / 1e6;
  r.sched_step_ms = 1e3 * p.schedule_seconds;
  r.cpu_share = p.in_place_share;
  r.ddr_gbs = p.ddr_bytes_per_second / 1e9;
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
  const HostModel host;
  std::printf(
      "cost model: %d GPUs, HBM %.1f TB/s, PCIe %.0f GB/s per switch uplink, %u sockets of "
      "DDR %.0f GB/s (CPU attention at %.0f%%), staging %.0f GiB per GPU, resident turnover "
      "%.0f%% per %u steps, pages of %d tokens, bf16 KV; the GPU reads weights, T0 and the "
      "host-side pages it "
      "attends at HBM bandwidth (compute = weights + T0 alone)\n\n",
      kGpus, host.hbm_bytes_per_second / 1e12, host.link_bytes_per_second / 1e9, host.sockets,
      host.ddr_bytes_per_second / 1e9, 100 * host.cpu_attention_efficiency,
      host.staging_bytes / (1ull << 30), 100 * host.turnover_per_retier, host.retier_interval,
      kPageTokens);
  std::printf(
      "| model | topology | batch | context | β | compute ms | all in HBM ms | stage all: PCIe "
      "MB/step | step ms | schedule: PCIe MB/step | step ms | T1 on CPU | DDR GB/s per socket | "
      "speedup |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv_path && !csv) {
    std::fprintf(stderr, "kvtier-schedule-sim: cannot write %s\n", csv_path);
    return 1;
  }
  if (csv) {
    std::fprintf(
        csv,
        "model,topology,batch,context,beta,compute_ms,all_in_hbm_ms,all_pcie_mb,all_step_ms,"
        "sched_pcie_mb,sched_step_ms,cpu_share,ddr_gbs\n");
  }
  for (const Model& m : kModels) {
    for (int switches : {2, 4}) {
      for (int batch : {1, 8, 32}) {
        for (int context : {4096, 16384, 32768}) {
          for (double beta : {0.25, 0.5}) {
            const Row r = Simulate(m, switches, batch, context, beta);
            std::printf(
                "| %s | %s | %d | %dK | %.2f | %.1f | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f%% | "
                "%.0f | "
                "%.2f× |\n",
                r.model.c_str(), r.topology.c_str(), r.batch, r.context / 1024, r.beta,
                r.compute_ms, r.all_in_hbm_ms, r.all_pcie_mb, r.all_step_ms, r.sched_pcie_mb,
                r.sched_step_ms, 100 * r.cpu_share, r.ddr_gbs, r.all_step_ms / r.sched_step_ms);
            if (csv) {
              std::fprintf(csv, "%s,%s,%d,%d,%.2f,%.4f,%.4f,%.3f,%.4f,%.3f,%.4f,%.4f,%.2f\n",
                           r.model.c_str(), r.topology.c_str(), r.batch, r.context, r.beta,
                           r.compute_ms, r.all_in_hbm_ms, r.all_pcie_mb, r.all_step_ms,
                           r.sched_pcie_mb, r.sched_step_ms, r.cpu_share, r.ddr_gbs);
            }
          }
        }
      }
    }
  }
  if (csv) std::fclose(csv);
  return 0;
}
