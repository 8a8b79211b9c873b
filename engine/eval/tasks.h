#ifndef KVTIER_ENGINE_EVAL_TASKS_H_
#define KVTIER_ENGINE_EVAL_TASKS_H_

// Long-context retrieval tasks generated in the repository from a seed (docs/evaluation.md):
// passkey (the Landmark-attention template), RULER-style needles (a number, a UUID, several
// look-alike keys of which one is asked, several values of one key), variable tracking and
// key-value retrieval over a JSON object. Lengths are measured with the model's tokenizer: the
// whole conversation (context, every question, every answer budget) fits `length` tokens.
// One place for the prompts: `kvtier-run eval --tasks` and `kvtier-run tasks --emit jsonl`
// (read by the Python door) use the same items and the same chat segments.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer.h"

namespace kvtier::engine {

struct TaskQuestion {
  std::string question;              // the user's question
  std::string answer_prefix;         // the assistant's reply starts with it (RULER's prefix)
  std::vector<std::string> answers;  // every one must appear in the reply (exact match)
};

struct TaskItem {
  std::string id;  // "<task>-<length>-<index>"
  std::string task;
  uint32_t length = 0;  // nominal tokens
  double depth = 0;     // relative position of the first asked needle in the context
  std::string context;  // the user's first message up to the first question
  std::vector<TaskQuestion> questions;  // asked in turn (question-agnostic) / the first only
  uint32_t max_new_tokens = 0;          // answer budget per question
};

struct TaskSpec {
  std::vector<std::string> tasks;  // names from TaskNames(), or "all"
  std::vector<uint32_t> lengths = {1024, 2048, 4096, 8192};
  uint32_t items = 10;  // per (task, length); depths spread evenly over the context
  uint64_t seed = 1;
};

// passkey, niah_number, niah_uuid, multikey, multivalue, vartrack, kv_json.
const std::vector<std::string>& TaskNames();

// Parses "passkey,multikey" / "all" and "1k,2k,4096" (INVALID_ARGUMENT naming --tasks or
// --lengths and the bad entry).
absl::StatusOr<std::vector<std::string>> ParseTaskNames(const std::string& csv);
absl::StatusOr<std::vector<uint32_t>> ParseLengths(const std::string& csv);

// Generates every (task, length, index) item. INVALID_ARGUMENT naming the field for an unknown
// task, zero items, or a length beyond `context_length` or too short for the task's questions.
absl::StatusOr<std::vector<TaskItem>> GenerateTasks(const TaskSpec& spec, const Tokenizer& tok,
                                                    uint32_t context_length);

// JSONL, one item per line (the fields above). LoadTasks: INVALID_ARGUMENT naming the file,
// the line and the field for malformed lines; NOT_FOUND when it cannot be read.
std::string TaskJson(const TaskItem& item);
absl::StatusOr<std::vector<TaskItem>> LoadTasks(const std::string& path);

// The conversation's token segments: turn 0 is the chat template's system message, the user
// turn's opening and the context; then per question its text and the assistant's opening
// (turn i > 0 first closes the previous answer and opens a new user turn). The question-aware
// regime prefills segment 0 + question 0 (with the assistant's opening and the answer prefix) at
// once; the question-agnostic one prefills segment 0 and feeds the questions later. Same tokens in
// both.
struct TaskSegments {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> questions;
  uint64_t last_user_turn_begin = 0;  // token where the user turn holding question 0 starts
};
TaskSegments Segment(const TaskItem& item, const Tokenizer& tok);

// Exact match: every answer occurs in `reply` as a whole word (not inside a longer run of
// letters or digits).
bool Matches(const std::string& reply, const std::vector<std::string>& answers);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_TASKS_H_
