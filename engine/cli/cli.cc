#include "engine/cli/cli.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "edge/daemon_socket.h"
#include "engine/forward_pass.h"
#include "engine/model_path.h"

namespace kvtier::engine {
namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvtier-run: %s\n", message.c_str());
  return code;
}

// --daemon when given, else $KVTIER_SOCKET when set (naming a daemon asks for it), else "" (local
// pools).
std::string DaemonAddress(const std::string& flag) {
  std::string where = flag;
  if (where.empty()) {
    const edge::SocketChoice env = edge::ChooseSocket(std::nullopt, "");
    where = env.path;
  }
  if (where.empty() || where.rfind("unix:", 0) == 0) return where;
  return where.find(':') != std::string::npos ? where : "unix:" + where;
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

absl::Status FillTaskSpec(CliArgs& args) {
  TaskSpec& spec = args.task_eval.spec;
  ASSIGN_OR_RETURN(spec.tasks, ParseTaskNames(args.task_names.empty() ? "all" : args.task_names));
  ASSIGN_OR_RETURN(spec.lengths, ParseLengths(args.lengths));
  return absl::OkStatus();
}

int RunTaskEvalCommand(CliArgs& args, CLI::App& ev) {
  TaskEvalOptions& t = args.task_eval;
  const EvalOptions& e = args.eval;
  t.model_path = args.model_path;
  t.threads = args.threads;
  t.progress = !args.quiet;
  t.out_dir = e.out_dir;
  t.configs = e.configs;
  // Shared flags keep the task evaluation's own defaults unless given.
  if (ev.count("--grid")) t.grid = e.grid;
  if (ev.count("--window-tokens")) t.window_tokens = e.window_tokens;
  if (ev.count("--page-tokens")) t.page_tokens = e.page_tokens;
  if (ev.count("--retier-interval")) t.retier_interval = e.retier_interval;
  if (t.tasks_file.empty()) {
    if (absl::Status s = FillTaskSpec(args); !s.ok()) return Fail(std::string(s.message()), 2);
  }
  absl::Status status = RunTaskEval(t);
  if (!status.ok()) return Fail(std::string(status.message()));
  std::fprintf(stderr, "wrote %s/results.csv, summary.md and summary.csv\n", t.out_dir.c_str());
  return 0;
}

int RunTasksCommand(CliArgs& args) {
  if (absl::Status s = FillTaskSpec(args); !s.ok()) return Fail(std::string(s.message()), 2);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Load(args.model_path, {.threads = args.threads});
  if (!model.ok()) return Fail(std::string(model.status().message()));
  absl::StatusOr<std::vector<TaskItem>> items =
      GenerateTasks(args.task_eval.spec, (*model)->tokenizer(), (*model)->config().context_length);
  if (!items.ok()) return Fail(std::string(items.status().message()), 2);
  for (const TaskItem& item : *items) {
    std::string line = TaskJson(item);
    if (args.with_tokens) {
      const TaskSegments seg = Segment(item, (*model)->tokenizer());
      nlohmann::json j = nlohmann::json::parse(line);
      j["context_tokens"] = seg.context;
      j["question_tokens"] = seg.questions;
      j["last_user_turn_begin"] = seg.last_user_turn_begin;
      line = j.dump();
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

int RunEvalCommand(CliArgs& args, CLI::App& ev) {
  if (!args.task_names.empty() || !args.task_eval.tasks_file.empty()) {
    return RunTaskEvalCommand(args, ev);
  }
  EvalOptions& e = args.eval;
  if (e.questions.empty())
    return Fail("eval: give --questions FILE, --tasks LIST or --tasks-file FILE", 2);
  e.model_path = args.model_path;
  e.threads = args.threads;
  e.progress = !args.quiet;
  absl::Status status = RunEval(e);
  if (!status.ok()) return Fail(std::string(status.message()));
  std::fprintf(stderr, "wrote %s/results.csv and %s/summary.md\n", e.out_dir.c_str(),
               e.out_dir.c_str());
  return 0;
}

void DeclareTaskSpec(CLI::App& app, CliArgs& args) {
  TaskSpec& spec = args.task_eval.spec;
  app.add_option("--lengths", args.lengths, "Conversation lengths in tokens: 1k,2k,4k,8k")
      ->capture_default_str();
  app.add_option("--items", spec.items, "Items per (task, length), depths spread evenly")
      ->capture_default_str();
  app.add_option("--seed", spec.seed, "Seed of the generated items")->capture_default_str();
}

void DeclareProtectedSet(CLI::App& app, uint32_t& sinks, std::string& protect) {
  app.add_option("--sink-tokens", sinks, "Hierarchy: first generated positions kept in T0")
      ->capture_default_str();
  app.add_option("--protect-prompt", protect,
                 "Hierarchy: prompt kept in T0: all | none | last-turn (the last user turn)")
      ->check(CLI::IsMember({"all", "none", "last-turn"}))
      ->capture_default_str();
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
  gen->add_option("--window-tokens", o.window_tokens, "Hierarchy: last positions kept in T0")
      ->capture_default_str();
  gen->add_option("--retier-interval", o.retier_interval, "Δ: decode steps between re-tierings")
      ->capture_default_str();
  DeclareProtectedSet(*gen, o.sink_tokens, o.protect_prompt);
  auto* daemon_opt =
      gen->add_option("--daemon", args.daemon,
                      absl::StrCat("kvtierd socket: unix:PATH (default: $", edge::kSocketEnv,
                                   " when set, else in-process pools)"));
  gen->add_flag("--local", args.local,
                "Use in-process pools (no daemon, whatever $KVTIER_SOCKET says)")
      ->excludes(daemon_opt);
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
  ev->add_option("--questions", e.questions,
                 "Fidelity: JSONL with \"question\" (and \"answer\") per line");
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
  // Accuracy on the generated retrieval tasks (docs/evaluation.md).
  TaskEvalOptions& t = args.task_eval;
  ev->add_option("--tasks", args.task_names,
                 "Accuracy on generated tasks: all | passkey,niah_number,niah_uuid,multikey,"
                 "multivalue,vartrack,kv_json (grid default tasks-quick, window 32)");
  ev->add_option("--tasks-file", t.tasks_file, "Accuracy on the tasks of a JSONL file");
  DeclareTaskSpec(*ev, args);
  ev->add_option("--regime", t.regime, "aware (question in the prompt) | agnostic (it comes later)")
      ->capture_default_str();
  ev->add_option("--turns", t.turns, "agnostic: questions asked in turn, re-tiering between")
      ->capture_default_str();
  DeclareProtectedSet(*ev, t.sink_tokens, t.protect_prompt);

  CLI::App* tasks = app.add_subcommand("tasks", "Generate the retrieval tasks (one JSON a line)");
  tasks->add_option("--tasks", args.task_names, "all | a comma-separated list");
  DeclareTaskSpec(*tasks, args);
  tasks->add_option("--emit", args.emit, "Output format: jsonl (the only one)")
      ->check(CLI::IsMember({"jsonl"}))
      ->capture_default_str();
  tasks->add_flag("--with-tokens", args.with_tokens,
                  "Add the token segments (context, questions, last user turn) per item");
}

int RunCli(CLI::App& app, CliArgs& args) {
  if (app.get_subcommand("eval")->parsed())
    return RunEvalCommand(args, *app.get_subcommand("eval"));
  if (app.get_subcommand("tasks")->parsed()) return RunTasksCommand(args);
  if (app.get_subcommand("generate")->parsed()) return RunGenerate(args);
  return 0;
}

}  // namespace kvtier::engine
