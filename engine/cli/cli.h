#ifndef KVTIER_ENGINE_CLI_CLI_H_
#define KVTIER_ENGINE_CLI_CLI_H_

// kvtier-run's command line: the flags of `generate`, `eval` and `tasks` (declared here so tests
// parse them) and running what was parsed.

#include <CLI/CLI.hpp>
#include <string>

#include "engine/cli/generate.h"
#include "engine/eval/eval.h"
#include "engine/eval/task_eval.h"

namespace kvtier::engine {

struct CliArgs {
  std::string model_path;
  int threads = 2;
  GenerateOptions generate;
  std::string prompt_file, daemon;
  std::string device = "cpu";  // --device: cpu | cuda
  bool local = false, json = false;
  EvalOptions eval;
  bool quiet = false;
  // eval --tasks / tasks --emit.
  TaskEvalOptions task_eval;
  std::string task_names, lengths = "1k,2k,4k,8k";
  bool with_tokens = false;
  std::string emit = "jsonl";
};

// Declares both subcommands and their flags on `app`, writing into `args`.
void DeclareCli(CLI::App& app, CliArgs& args);

// Runs the parsed subcommand; the process exit code. 2 for usage errors, among them a --device
// this build or machine cannot serve (no CUDA support, no device, no CUDA store backend).
int RunCli(CLI::App& app, CliArgs& args);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_CLI_CLI_H_
