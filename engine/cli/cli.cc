#include "engine/cli/cli.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/forward_pass.h"
#include "engine/model_path.h"

namespace kvtier::engine {
namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvtier-run: %s\n", message.c_str());
  return code;
}

std::string DaemonAddress(const std::string& flag) {
  if (flag.empty() || flag.rfind("unix:", 0) == 0) return flag;
  return flag.find(':') != std::string::npos ? flag : "unix:" + flag;
}

int RunGenerate(const CliArgs& args) {
  GenerateOptions options = args.generate;
  if (!args.prompt_file.empty()) {
    std::ifstream in(args.prompt_file);
    if (!in) return Fail("cannot read --prompt-file " + args.prompt_file);
    std::stringstream text;
    text << in.rdbuf();
    options.prompt = text.str();
  }
  if (options.prompt.empty()) {
    std::fprintf(stderr, "kvtier-run generate: give --prompt TEXT or --prompt-file FILE\n");
    return 2;
  }
  absl::StatusOr<Device> device = ParseDevice(args.device);
  if (!device.ok()) return Fail(std::string(device.status().message()), 2);
  options.device = *device;
  options.daemon_address = args.local ? "" : DaemonAddress(args.daemon);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Load(args.model_path, {.threads = args.threads});
  if (!model.ok()) return Fail(std::string(model.status().message()));
  // A device this build or machine cannot serve is a usage error (exit 2), found before any run.
  absl::StatusOr<DeviceSetup> setup = SetUpDevice(**model, options);
  if (!setup.ok()) {
    const bool usage = setup.status().code() == absl::StatusCode::kFailedPrecondition;
    return Fail(std::string(setup.status().message()), usage ? 2 : 1);
  }
  auto stream = [&](const std::string& piece) {
    std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
  };
  absl::StatusOr<GenerateResult> result = Generate(
      **model, *setup, options, args.json ? std::function<void(const std::string&)>() : stream);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (args.json) {
    std::printf("%s\n", ReportJson(*result, options).c_str());
  } else {
    std::printf("\n\n%s", FormatReport(*result, options).c_str());
  }
  return 0;
}

int RunEvalCommand(CliArgs& args) {
  EvalOptions& e = args.eval;
  e.model_path = args.model_path;
  e.threads = args.threads;
  e.progress = !args.quiet;
  absl::Status status = RunEval(e);
  if (!status.ok()) return Fail(std::string(status.message()));
  std::fprintf(stderr, "wrote %s/results.csv and %s/summary.md\n", e.out_dir.c_str(),
               e.out_dir.c_str());
  return 0;
}

}  // namespace

void DeclareCli(CLI::App& app, CliArgs& args) {
  args.model_path = DefaultModelPath();
  app.require_subcommand(1, 1);
  app.add_option("--model", args.model_path, "GGUF model file")->capture_default_str();
  app.add_option("--threads", args.threads, "Compute threads")->capture_default_str();

  CLI::App* gen = app.add_subcommand("generate", "Generate text for one prompt, then report tiers");
  GenerateOptions& o = args.generate;
  auto* prompt = gen->add_option("--prompt", o.prompt, "Prompt text");
  gen->add_option("--prompt-file", args.prompt_file, "Read the prompt from a file")
      ->excludes(prompt);
  gen->add_flag("--chat", o.chat, "Wrap the prompt in the model's chat template");
  gen->add_option("--max-new-tokens", o.max_new_tokens, "Stop after this many tokens")
      ->capture_default_str();
  gen->add_option("--policy", o.policy, "full | hierarchy | streaming")
      ->check(CLI::IsMember({"full", "hierarchy", "streaming", "arkv", "h2o", "rkv"}))
      ->capture_default_str();
  gen->add_option("--hbm-ratio", o.hbm_ratio, "β: share of live tokens kept in T0")
      ->capture_default_str();
  gen->add_option("--evict-ratio", o.evict_ratio, "r: cumulative evicted share (lossy)")
      ->capture_default_str();
  gen->add_option("--compress-ratio", o.compress_ratio, "γ: share kept 8-bit in T2 (lossy)")
      ->capture_default_str();
  gen->add_option("--max-lost-mass", o.max_lost_mass,
                  "ε: evict only while the evicted pages' estimated attention mass per step "
                  "stays at most this; beyond it pages are offloaded or compressed (default: no "
                  "limit; 0: no eviction)");
  gen->add_option("--page-tokens", o.page_tokens, "Positions per page")->capture_default_str();
  gen->add_option("--codec", o.codec, "T2 codec: int8_kivi | fp8_e4m3 | minmax")
      ->capture_default_str();
  auto* daemon_opt = gen->add_option("--daemon", args.daemon, "kvtierd socket: unix:PATH");
  gen->add_flag("--local", args.local, "Use in-process pools (no daemon)")->excludes(daemon_opt);
  gen->add_option("--link-gbps", o.link_gbps,
                  "With --daemon: declare a host link of this many GB/s (prefetch schedules; the "
                  "CPU attends what the schedule leaves in place as a split)")
      ->check(CLI::Range(0.0, 1000.0));
  gen->add_option("--link-id", o.link_id, "With --link-gbps: the PCIe switch shared with others");
  gen->add_option("--staging-mib", o.staging_mib,
                  "With --link-gbps: staging memory for pages kept across steps")
      ->capture_default_str();
  gen->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  gen->add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  gen->add_option("--top-p", o.top_p, "Nucleus sampling mass")->capture_default_str();
  gen->add_flag("--json", args.json, "Print one JSON object: text, tokens, report");
  gen->add_option("--device", args.device,
                  "Where the model runs: cpu (default) | cuda (needs a CUDA build and device; "
                  "the KV cache is then the tiered store's CUDA backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();

  CLI::App* ev = app.add_subcommand(
      "eval",
      "Fidelity of tiering and eviction configurations vs the full cache (docs/evaluation.md)");
  EvalOptions& e = args.eval;
  ev->add_option("--questions", e.questions, "JSONL with \"question\" (and \"answer\") per line")
      ->required();
  ev->add_option("--out", e.out_dir, "Output directory (results.csv, summary.md; resumable)")
      ->required();
  ev->add_option("--grid", e.grid, "paper | headline | quick | \"\" (only --config)")
      ->capture_default_str();
  ev->add_option("--config", e.configs,
                 "Extra configuration POLICY:hbm=X,evict=X,compress=X,codec=NAME (repeatable)");
  ev->add_option("--offset", e.offset, "First question (0-based)")->capture_default_str();
  ev->add_option("--limit", e.limit, "Questions to run (0 = all)")->capture_default_str();
  ev->add_option("--min-new-tokens", e.min_new_tokens,
                 "Hold back end-of-sequence until this many tokens (long chains)")
      ->capture_default_str();
  ev->add_option("--max-new-tokens", e.max_new_tokens, "Chain length cap")->capture_default_str();
  ev->add_option("--page-tokens", e.page_tokens, "Positions per page (1 = token-exact)")
      ->capture_default_str();
  ev->add_option("--retier-interval", e.retier_interval, "Δ: decode steps between re-tierings")
      ->capture_default_str();
  ev->add_option("--window-tokens", e.window_tokens, "Hierarchy's protected recent window")
      ->capture_default_str();
  ev->add_option("--jobs", e.jobs, "Questions in parallel (threads split between them)")
      ->capture_default_str();
  ev->add_option("--reference-dir", e.reference_dir,
                 "Cache of full-cache reference chains (default OUT/references)");
  ev->add_flag("--quiet", args.quiet, "No progress bar");
}

int RunCli(CLI::App& app, CliArgs& args) {
  if (app.get_subcommand("eval")->parsed()) return RunEvalCommand(args);
  if (app.get_subcommand("generate")->parsed()) return RunGenerate(args);
  return 0;
}

}  // namespace kvtier::engine
