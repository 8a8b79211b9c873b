#ifndef KVTIER_CORE_PLANNING_STEP_MODEL_H_
#define KVTIER_CORE_PLANNING_STEP_MODEL_H_

// The decode-step cost model of docs/scheduling.md ("The node-scale picture"), shared by the
// node-scale simulator (bench/sim) and the capacity planner (`kvtierctl plan`): one host, every
// GPU carrying the same load, each step either restaging all of its host-side KV over PCIe
// ("stage all") or following the daemon's schedule (link shares from ShareLinks, pages split by
// SchedulePages into resident / staged / attended in place by the CPU). The GPU's side of a step
// is memory-bound: it reads the weights, T0 and every host-side page it attends from HBM (all of
// them when staging all; the resident and staged ones under a schedule). Pure; it predicts and
// measures nothing. What it ignores: PCIe/NVLink contention from tensor-parallel traffic, the
// copies' writes into HBM, kernel launch and merge costs, prefill, and the CPU's cost of decoding
// T2 codes.

#include <cstdint>

namespace kvtier::planning {

// The host, with the simulator's defaults (an H200 host of 8 GPUs behind 2 PCIe switches).
struct HostModel {
  uint32_t gpus = 8;
  uint32_t gpus_per_link = 4;                 // GPUs sharing one switch uplink
  uint32_t sockets = 2;                       // NUMA nodes; GPUs spread evenly over them
  double hbm_bytes_per_second = 4.8e12;       // H200 HBM3e
  double link_bytes_per_second = 55e9;        // PCIe Gen5 x16, effective, host to device
  double ddr_bytes_per_second = 215e9;        // per socket: 8 × DDR5-4800 (307 GB/s) × 0.7
  double cpu_attention_efficiency = 0.7;      // split attention at 70% of the DDR bound
  double staging_bytes = 8.0 * (1ull << 30);  // per GPU, HBM kept for resident pages
  double turnover_per_retier = 0.10;          // share of the resident set replaced per Δ
  uint32_t retier_interval = 64;              // Δ
};

// One GPU's share of the work in a decode step.
struct GpuLoad {
  double weight_bytes = 0;   // weights this GPU reads each step
  double t0_bytes = 0;       // KV kept in HBM (T0)
  double t1_bytes = 0;       // full-precision KV in host DDR (T1)
  double t1_page_bytes = 0;  // one T1 page
  double t2_bytes = 0;       // 8-bit KV in host DDR (T2)
  double t2_page_bytes = 0;  // one T2 page (codes and scales)
};

struct StepPrediction {
  double compute_seconds = 0;  // (weights + T0) / HBM: what any step reads from HBM
  // Stage all: the whole of T1 and T2 crosses PCIe every step, and the GPU attends all of it.
  double stage_all_pcie_bytes = 0;
  double stage_all_gpu_seconds = 0;  // (weights + T0 + T1 + T2) / HBM
  double stage_all_seconds = 0;
  // The daemon's schedule: the GPU attends the resident and staged pages, the CPU the rest.
  double schedule_pcie_bytes = 0;
  double schedule_gpu_seconds = 0;  // (weights + T0 + resident + staged) / HBM
  double schedule_seconds = 0;
  double in_place_share = 0;        // of T1 + T2 bytes, attended by the CPU in DDR
  double ddr_bytes_per_second = 0;  // per socket, under the schedule
};

// REQUIRES: every field of `host` positive (gpus a multiple of gpus_per_link and of sockets)
// and `load`'s byte counts non-negative with positive page sizes where bytes are.
StepPrediction PredictStep(const HostModel& host, const GpuLoad& load);

}  // namespace kvtier::planning

#endif  // KVTIER_CORE_PLANNING_STEP_MODEL_H_
