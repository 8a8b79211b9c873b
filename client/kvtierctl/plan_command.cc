#include "client/kvtierctl/plan_command.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/kvtierctl/model_source.h"
#include "client/kvtierctl/table.h"
#include "core/planning/capacity.h"
#include "core/status/status_macros.h"

namespace kvtier::ctl {
namespace {

using planning::Plan;
using planning::PlanInput;

// Options and their defaults (the daemon's defaults for β, r, γ and the protected set; the
// cost model's host for the rest). Empty = required.
struct Option {
  const char* name;
  const char* fallback;
  const char* help;
};
constexpr Option kPlanOptions[] = {
    {"model", "", "Built-in name, GGUF file, or Hugging Face config.json (or its directory)"},
    {"gpus", "1", "GPUs on this host"},
    {"tp", "0", "GPUs per replica (tensor parallel); 0 = all of them"},
    {"batch", "1", "Sequences decoding at once per replica"},
    {"context", "", "Tokens per sequence (its longest)"},
    {"prompt-tokens", "0", "Of which the prompt"},
    {"hbm-ratio", "0.5", "β: share of live tokens kept in HBM (T0)"},
    {"evict-ratio", "0", "r: share of eligible tokens evicted (T3)"},
    {"compress-ratio", "0", "γ: share of surviving candidates kept 8-bit (T2)"},
    {"page-tokens", "16", "Tokens per page"},
    {"sink-tokens", "4", "First generated tokens kept in HBM"},
    {"window-tokens", "128", "Last positions kept in HBM"},
    {"dtype-bytes", "2", "Bytes per KV element (2 = bf16/fp16)"},
    {"pcie-gbps", "55", "Host-to-device GB/s of one PCIe switch uplink"},
    {"gpus-per-link", "4", "GPUs sharing one uplink"},
    {"sockets", "2", "CPU sockets (NUMA nodes)"},
    {"ddr-gbps", "215", "DDR GB/s per socket"},
    {"staging-gib", "8", "HBM per GPU for resident T1/T2 pages"},
    {"gpu-mem-gib", "141", "HBM per GPU"},
};

// Each option's text as a number in [lo, hi]; INVALID_ARGUMENT naming the option otherwise.
class Reader {
 public:
  explicit Reader(const std::map<std::string, std::string>& v) : values_(v) {}
  absl::StatusOr<double> Number(const char* name, double lo, double hi) const {
    const std::string& text = values_.at(name);
    double v = 0;
    if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be a number in [", lo, ", ", hi, "], got '", text, "'"));
    }
    return v;
  }
  absl::StatusOr<uint64_t> Count(const char* name, uint64_t lo, uint64_t hi) const {
    const std::string& text = values_.at(name);
    uint64_t v = 0;
    if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer in [", lo,
                                                     ", ", hi, "], got '", text, "'"));
    }
    return v;
  }

 private:
  const std::map<std::string, std::string>& values_;
};

// The options as a planner input. Wide ranges here (what parses); ComputePlan checks the rest.
absl::StatusOr<PlanInput> ReadInput(const PlanArgs& args) {
  const Reader r(args.values);
  PlanInput in;
  if (args.values.at("model").empty()) return absl::InvalidArgumentError("--model is required");
  if (args.values.at("context").empty()) {
    return absl::InvalidArgumentError("--context is required");
  }
  ASSIGN_OR_RETURN(in.model, LoadModel(args.values.at("model")));
  constexpr uint64_t kBig = uint64_t{1} << 40;
  ASSIGN_OR_RETURN(uint64_t gpus, r.Count("gpus", 0, kBig));
  ASSIGN_OR_RETURN(uint64_t tp, r.Count("tp", 0, kBig));
  ASSIGN_OR_RETURN(uint64_t batch, r.Count("batch", 0, kBig));
  ASSIGN_OR_RETURN(in.context_tokens, r.Count("context", 0, kBig));
  ASSIGN_OR_RETURN(in.prompt_tokens, r.Count("prompt-tokens", 0, kBig));
  ASSIGN_OR_RETURN(in.tiering.budgets.hbm_ratio, r.Number("hbm-ratio", 0, 1));
  ASSIGN_OR_RETURN(in.tiering.budgets.evict_ratio, r.Number("evict-ratio", 0, 1));
  ASSIGN_OR_RETURN(in.tiering.budgets.compress_ratio, r.Number("compress-ratio", 0, 1));
  ASSIGN_OR_RETURN(uint64_t page, r.Count("page-tokens", 1, 65536));
  ASSIGN_OR_RETURN(uint64_t sinks, r.Count("sink-tokens", 0, 1u << 30));
  ASSIGN_OR_RETURN(uint64_t window, r.Count("window-tokens", 0, 1u << 30));
  ASSIGN_OR_RETURN(uint64_t dtype, r.Count("dtype-bytes", 1, 4));
  ASSIGN_OR_RETURN(double pcie, r.Number("pcie-gbps", 0.001, 1000));
  ASSIGN_OR_RETURN(uint64_t per_link, r.Count("gpus-per-link", 1, 64));
  ASSIGN_OR_RETURN(uint64_t sockets, r.Count("sockets", 1, 64));
  ASSIGN_OR_RETURN(double ddr, r.Number("ddr-gbps", 0.001, 10000));
  ASSIGN_OR_RETURN(double staging, r.Number("staging-gib", 0.001, 4096));
  ASSIGN_OR_RETURN(double gpu_mem, r.Number("gpu-mem-gib", 0.001, 4096));
  auto u32 = [](uint64_t v) { return static_cast<uint32_t>(std::min<uint64_t>(v, 0xffffffffu)); };
  in.gpus = u32(gpus);
  in.tensor_parallel = u32(tp);
  in.batch = u32(batch);
  in.tiering.page_tokens = u32(page);
  in.tiering.sink_tokens = u32(sinks);
  in.tiering.window_tokens = u32(window);
  in.tiering.protect_prompt = !args.no_protect_prompt;
  in.element_bytes = u32(dtype);
  in.host.link_bytes_per_second = pcie * 1e9;
  in.host.gpus_per_link = u32(per_link);
  in.host.sockets = u32(sockets);
  in.host.ddr_bytes_per_second = ddr * 1e9;
  in.host.staging_bytes = staging * (1ull << 30);
  in.gpu_memory_bytes = gpu_mem * (1ull << 30);
  return in;
}

std::string Ms(double seconds) { return absl::StrFormat("%.2f ms", 1e3 * seconds); }
std::string YesNo(bool b) { return b ? "yes" : "NO"; }

std::string Render(const PlanInput& in, const Plan& p, const absl::StatusOr<HostMemory>& mem) {
  const uint64_t host_ddr = p.host_t1_bytes + p.host_t2_bytes;
  Table t({"", "VALUE"}, /*align_numbers=*/false);
  t.AddRow({"model", absl::StrFormat("%s: %u layers, %u KV heads (%u query), head_dim %u",
                                     in.model.name, in.model.num_layers, in.model.num_kv_heads,
                                     in.model.num_heads, in.model.head_dim)});
  t.AddRow({"KV per token", absl::StrCat(HumanBytes(p.kv_bytes_per_token), " (an MHA estimate: ",
                                         HumanBytes(p.mha_bytes_per_token), ")")});
  t.AddRow(
      {"layout", absl::StrFormat("%u replica(s) × %u GPU(s), %u KV head(s) per GPU, batch %u",
                                 p.replicas, in.gpus / p.replicas, p.kv_heads_per_gpu, in.batch)});
  t.AddRow(
      {"sequence tokens", absl::StrFormat("T0 %u  T1 %u  T2 %u  evicted %u (protected %u)",
                                          p.tiers.t0_tokens, p.tiers.t1_tokens, p.tiers.t2_tokens,
                                          p.tiers.t3_tokens, p.tiers.protected_tokens)});
  t.AddRow({"KV per sequence", absl::StrCat(HumanBytes(p.kv_bytes_per_token * in.context_tokens),
                                            " (", HumanBytes(p.seq_full_bytes), " per GPU)")});
  t.AddRow({"HBM per GPU", absl::StrCat("weights ", HumanBytes(p.gpu_weight_bytes), " + KV ",
                                        HumanBytes(p.gpu_full_bytes), " without kvtier, ",
                                        HumanBytes(p.gpu_t0_bytes), " kept with it")});
  t.AddRow({"HBM saved", absl::StrCat(HumanBytes(p.gpu_saved_bytes), " per GPU, ",
                                      HumanBytes(p.gpu_saved_bytes * in.gpus), " per host")});
  t.AddRow({"fits in HBM", absl::StrCat("without kvtier: ", YesNo(p.fits_hbm_full),
                                        ", with (+ staging): ", YesNo(p.fits_hbm_tiered))});
  t.AddRow({"DDR pool (T1)", absl::StrCat(HumanBytes(p.host_t1_bytes), " per host")});
  t.AddRow({"compressed pool (T2)", absl::StrCat(HumanBytes(p.host_t2_bytes), " per host")});
  t.AddRow({"fits in this host's DDR",
            mem.ok() ? absl::StrCat(YesNo(host_ddr <= mem->available_bytes), " (",
                                    HumanBytes(host_ddr), " of ", HumanBytes(mem->available_bytes),
                                    " available, ", HumanBytes(mem->total_bytes), " total)")
                     : std::string(mem.status().message())});
  t.AddRow({"PCIe per step per GPU",
            absl::StrCat(HumanBytes(p.step.stage_all_pcie_bytes), " restaging all, ",
                         HumanBytes(p.step.schedule_pcie_bytes), " with schedules")});
  t.AddRow(
      {"step (predicted)",
       absl::StrCat(Ms(p.step.stage_all_seconds), " restaging all, ", Ms(p.step.schedule_seconds),
                    " with schedules (", absl::StrFormat("%.0f%%", 100 * p.step.in_place_share),
                    " attended in DDR); ", Ms(p.full_step_seconds), " all in HBM")});
  t.AddRow({"GPU reads per step", absl::StrCat(Ms(p.step.stage_all_gpu_seconds), " restaging all, ",
                                               Ms(p.step.schedule_gpu_seconds), " with schedules, ",
                                               Ms(p.full_step_seconds),
                                               " all in HBM (weights, T0 and the pages the GPU "
                                               "attends, at HBM bandwidth)")});
  return t.Render();
}

nlohmann::json ToJson(const PlanInput& in, const Plan& p, const absl::StatusOr<HostMemory>& mem) {
  nlohmann::json j = {
      {"model", in.model.name},
      {"kv_bytes_per_token", p.kv_bytes_per_token},
      {"mha_bytes_per_token", p.mha_bytes_per_token},
      {"replicas", p.replicas},
      {"kv_heads_per_gpu", p.kv_heads_per_gpu},
      {"tokens",
       {{"t0", p.tiers.t0_tokens},
        {"t1", p.tiers.t1_tokens},
        {"t2", p.tiers.t2_tokens},
        {"t3", p.tiers.t3_tokens},
        {"protected", p.tiers.protected_tokens}}},
      {"sequence_bytes", p.kv_bytes_per_token * in.context_tokens},
      {"gpu",
       {{"weight_bytes", p.gpu_weight_bytes},
        {"full_bytes", p.gpu_full_bytes},
        {"t0_bytes", p.gpu_t0_bytes},
        {"saved_bytes", p.gpu_saved_bytes},
        {"fits_hbm_full", p.fits_hbm_full},
        {"fits_hbm_tiered", p.fits_hbm_tiered}}},
      {"host",
       {{"t1_bytes", p.host_t1_bytes},
        {"t2_bytes", p.host_t2_bytes},
        {"saved_bytes", p.gpu_saved_bytes * in.gpus}}},
      {"step",
       {{"compute_s", p.step.compute_seconds},
        {"stage_all_pcie_bytes", p.step.stage_all_pcie_bytes},
        {"stage_all_gpu_s", p.step.stage_all_gpu_seconds},
        {"stage_all_s", p.step.stage_all_seconds},
        {"schedule_pcie_bytes", p.step.schedule_pcie_bytes},
        {"schedule_gpu_s", p.step.schedule_gpu_seconds},
        {"schedule_s", p.step.schedule_seconds},
        {"in_place_share", p.step.in_place_share},
        {"all_in_hbm_s", p.full_step_seconds}}},
  };
  if (mem.ok()) {
    j["host"]["mem_total_bytes"] = mem->total_bytes;
    j["host"]["mem_available_bytes"] = mem->available_bytes;
    j["host"]["fits_ddr"] = p.host_t1_bytes + p.host_t2_bytes <= mem->available_bytes;
  }
  return j;
}

}  // namespace

CLI::App* AddPlanCommand(CLI::App& app, PlanArgs* args) {
  CLI::App* plan =
      app.add_subcommand("plan", "Size HBM, DDR and PCIe for a model (talks to no daemon)");
  for (const Option& o : kPlanOptions) {
    args->values[o.name] = o.fallback;
    CLI::Option* opt = plan->add_option(absl::StrCat("--", o.name), args->values[o.name], o.help);
    if (*o.fallback != '\0') opt->capture_default_str();
  }
  plan->add_flag("--no-protect-prompt", args->no_protect_prompt,
                 "Let the prompt be tiered like generated tokens");
  plan->add_flag("--json", args->json, "Print the plan as JSON");
  return plan;
}

int RunPlan(const PlanArgs& args) {
  absl::StatusOr<PlanInput> in = ReadInput(args);
  absl::StatusOr<Plan> plan = in.ok() ? planning::ComputePlan(*in) : in.status();
  if (!plan.ok()) {
    std::fprintf(stderr, "kvtierctl plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::ostringstream text;
  text << meminfo.rdbuf();
  const absl::StatusOr<HostMemory> mem = ParseMeminfo(text.str());
  const std::string out =
      args.json ? ToJson(*in, *plan, mem).dump(2) + "\n" : Render(*in, *plan, mem);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace kvtier::ctl
