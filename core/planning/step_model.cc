#include "core/planning/step_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tiering/schedule.h"

namespace kvtier::planning {
namespace {

using tiering::LinkDemand;
using tiering::SchedulePage;

// Each GPU's share of its link when every GPU asks for `demand` bytes per second.
double LinkShare(const HostModel& host, double demand) {
  const uint32_t links = host.gpus / host.gpus_per_link;
  std::vector<double> capacity(links, host.link_bytes_per_second);
  std::vector<LinkDemand> demands(host.gpus);
  for (uint32_t g = 0; g < host.gpus; ++g) demands[g] = {g / host.gpus_per_link, demand};
  return (*tiering::ShareLinks(capacity, demands))[0];
}

// `bytes` cut into pages of `page_bytes` (the last one counted whole), ranked at `score`: T1
// pages rank above T2 pages, as tiering fills T1 before T2.
void AppendPages(double bytes, double page_bytes, float score, std::vector<SchedulePage>* pages) {
  if (bytes <= 0 || page_bytes <= 0) return;
  const size_t n = static_cast<size_t>(std::ceil(bytes / page_bytes));
  pages->insert(pages->end(), n, SchedulePage{score, static_cast<uint64_t>(page_bytes)});
}

}  // namespace

StepPrediction PredictStep(const HostModel& host, const GpuLoad& load) {
  StepPrediction p;
  const double host_bytes = load.t1_bytes + load.t2_bytes;  // what lives in DDR, per GPU
  const double compute = (load.weight_bytes + load.t0_bytes) / host.hbm_bytes_per_second;
  p.compute_seconds = compute;
  const double gpus_per_socket = host.gpus / host.sockets;

  // Stage all: every GPU pulls all of it every step; the links and DDR bound the step.
  const double all_share = LinkShare(host, host_bytes / compute);
  const double ddr_all = host_bytes * gpus_per_socket / host.ddr_bytes_per_second;
  p.stage_all_pcie_bytes = host_bytes;
  p.stage_all_gpu_seconds = compute + host_bytes / host.hbm_bytes_per_second;
  p.stage_all_seconds = std::max({p.stage_all_gpu_seconds, host_bytes / all_share, ddr_all});

  // The schedule: resident pages cost only their turnover; staging gets what hides under the
  // step; the rest is attended by the CPU in DDR.
  std::vector<SchedulePage> pages;
  AppendPages(load.t1_bytes, load.t1_page_bytes, 1, &pages);
  AppendPages(load.t2_bytes, load.t2_page_bytes, 0, &pages);
  const double resident_guess = std::min(host_bytes, host.staging_bytes);
  const double churn = resident_guess * host.turnover_per_retier / host.retier_interval;
  const double share = LinkShare(host, (host_bytes - resident_guess + churn) / compute);
  // The socket's DDR serves the staged copies of its GPUs and their CPU attention; the CPU
  // reads what is left at cpu_attention_efficiency of it.
  const double cpu_rate =
      host.ddr_bytes_per_second * host.cpu_attention_efficiency / gpus_per_socket;
  // The budget: what hides under the step (its weights and T0 part: a lower bound), or, when the
  // rest cannot hide anyway, the split at which the link and the CPU finish together (each path
  // takes bytes in proportion to speed).
  const double rest = std::max(0.0, host_bytes - host.staging_bytes);
  const double budget = std::max(share * compute - churn, rest * share / (share + cpu_rate));
  const tiering::StepSchedule s =
      tiering::SchedulePages(pages, {.staging_bytes = static_cast<uint64_t>(host.staging_bytes),
                                     .h2d_bytes_per_step = static_cast<uint64_t>(budget)});
  const double pcie = s.staged_bytes + churn;
  const double cpu = s.in_place_bytes / cpu_rate;
  // DDR is shared by both paths: the copies the link pulls and the CPU's reads.
  const double ddr = gpus_per_socket * (pcie + s.in_place_bytes) / host.ddr_bytes_per_second;
  const double gpu =
      compute + static_cast<double>(s.resident_bytes + s.staged_bytes) / host.hbm_bytes_per_second;
  const double step = std::max({gpu, pcie / share, cpu, ddr});
  p.schedule_pcie_bytes = pcie;
  p.schedule_gpu_seconds = gpu;
  p.schedule_seconds = step;
  p.in_place_share = host_bytes > 0 ? s.in_place_bytes / host_bytes : 0;
  p.ddr_bytes_per_second = gpus_per_socket * (pcie + s.in_place_bytes) / step;
  return p;
}

}  // namespace kvtier::planning
