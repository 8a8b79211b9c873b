// kvtier-run: the reference worker. `generate` runs one prompt through SmolLM2 and the tiered
// cache; `eval` measures fidelity against eviction baselines (see docs/evaluation.md).

#include "engine/cli/cli.h"

int main(int argc, char** argv) {
  using namespace kvtier::engine;
  CLI::App app{
      "kvtier-run: the kvtier reference worker (SmolLM2-135M through the tiered KV cache)"};
  CliArgs args;
  DeclareCli(app, args);
  CLI11_PARSE(app, argc, argv);
  return RunCli(app, args);
}
