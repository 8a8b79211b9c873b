#ifndef KVTIER_ENGINE_CLI_CLI_H_
#define KVTIER_ENGINE_CLI_CLI_H_

// kvtier-run's command line: the flags of `generate` and `eval` (declared here so tests parse
// them) and running what was parsed.

#include <CLI/CLI.hpp>
#include <string>

#include "engine/cli/generate.h"
#include "engine/eval/eval.h"

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
};

// Declares both subcommands and their flags on `app`, writing into `args`.
void DeclareCli(CLI::App& app, CliArgs& args);

// Runs the parsed subcommand; the process exit code. 2 for usage errors, among them a --device
// this build or machine cannot serve (no CUDA support, no device, no CUDA store backend).
int RunCli(CLI::App& app, CliArgs& args);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_CLI_CLI_H_
