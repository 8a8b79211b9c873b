#ifndef KVTIER_ENGINE_EVAL_EVAL_H_
#define KVTIER_ENGINE_EVAL_EVAL_H_

// `kvtier-run eval`: fidelity of every configuration of a grid against the full cache, on the
// real model, per question of a JSONL file (docs/evaluation.md).
//
// Per question: the full-cache greedy chain (the reference; cached on disk, keyed by the model
// file's hash, the prompt and the lengths), then one batched decode of, per configuration, a
// teacher-forced sequence (fed the reference chain: top-1 agreement and KL(full ‖ config) per
// step, against a full-cache sequence in the same batch) and a free-running one (its own greedy
// chain: identical prefix, final answer). Results are appended to OUT/results.csv per question;
// a restarted run skips the questions already there.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/eval/grid.h"

namespace kvtier::engine {

struct EvalOptions {
  std::string model_path;
  std::string questions;             // JSONL: "question" (and "answer")
  std::string grid = "quick";        // paper | quick | "" (only --config)
  std::vector<std::string> configs;  // extra "policy:key=value,..." specs
  std::string out_dir;
  std::string reference_dir;    // "" = OUT/references
  uint32_t offset = 0;          // first question (0-based, in file order)
  uint32_t limit = 0;           // questions to run; 0 = all
  uint32_t min_new_tokens = 0;  // end-of-sequence held back until this many tokens
  uint32_t max_new_tokens = 256;
  uint32_t page_tokens = 16;
  uint32_t retier_interval = 64;
  uint32_t window_tokens = 128;  // hierarchy's protected recent window
  uint32_t jobs = 1;  // questions evaluated in parallel, each with its own model instance
  int threads = 2;    // total compute threads (split over jobs)
  bool progress = true;
};

// The chat prompt for a question (documented in docs/evaluation.md).
std::string EvalPrompt(const std::string& question);

// Runs (or resumes) the evaluation, then writes OUT/summary.md. INVALID_ARGUMENT for bad
// flags, an unknown policy or codec, a malformed question file (with the line), or an OUT that
// holds a run with a different configuration (nothing there is changed then).
absl::Status RunEval(const EvalOptions& options);

// Writes OUT/summary.md from OUT/results.csv: per configuration, means with 95% bootstrap
// intervals.
absl::Status WriteSummary(const std::string& out_dir);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_EVAL_H_
