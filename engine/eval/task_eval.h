#ifndef KVTIER_ENGINE_EVAL_TASK_EVAL_H_
#define KVTIER_ENGINE_EVAL_TASK_EVAL_H_

// `kvtier-run eval --tasks`: accuracy on the generated retrieval tasks (engine/eval/tasks.h) of
// the full cache and of every configuration of a grid, in one of two regimes
// (docs/evaluation.md):
//   aware     the question is in the prompt when placement is decided;
//   agnostic  the context is prefilled and placed (the eviction baselines compress it) before
//             the question arrives; then the question, then the answer; with --turns N the
//             item's questions are asked in turn, re-tiering between turns.
// Per item the prompt is prefilled once for every configuration (FanOutCache) and each answer
// is decoded greedily in one batch. Results are appended to OUT/results.csv per item; a
// restarted run skips the items already there.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/eval/tasks.h"

namespace kvtier::engine {

struct TaskEvalOptions {
  std::string model_path;
  std::string tasks_file;  // JSONL (`kvtier-run tasks --emit jsonl`); "" = generate from spec
  TaskSpec spec;
  std::string regime = "aware";      // aware | agnostic
  uint32_t turns = 1;                // agnostic: questions asked in turn (at most the item's)
  std::string grid = "tasks-quick";  // a MakeGrid name, or "none" (the full cache only)
  std::vector<std::string> configs;  // extra "policy:key=value,..." specs
  std::string out_dir;
  uint32_t page_tokens = 16;
  uint32_t retier_interval = 256;  // Δ: placement at prefill end and between turns only
  // The hierarchy's protected set (defaults measured in docs/evaluation.md).
  uint32_t window_tokens = 32;
  uint32_t sink_tokens = 4;
  std::string protect_prompt = "none";  // none | all | last-turn
  int threads = 2;
  bool progress = true;
};

// Runs (or resumes) the evaluation, then writes OUT/summary.md and OUT/summary.csv.
// INVALID_ARGUMENT naming the flag or field for bad options, a malformed task file, an item
// longer than the model's context, a hierarchy budget smaller than its protected set, or an OUT
// holding a different run (nothing there is changed then).
absl::Status RunTaskEval(const TaskEvalOptions& options);

// OUT/summary.md and OUT/summary.csv from OUT/results.csv: per (task, length, regime, config)
// accuracy with its 95% Wilson interval, retention against the full cache, T0 / T1 / T2 bytes
// and the evicted fraction.
absl::Status WriteTaskSummary(const std::string& out_dir);

// 95% Wilson score interval of `correct` successes in `n` trials.
struct Wilson {
  double p = 0, lo = 0, hi = 0;
};
Wilson WilsonInterval(uint64_t correct, uint64_t n);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_TASK_EVAL_H_
