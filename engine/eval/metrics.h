#ifndef KVTIER_ENGINE_EVAL_METRICS_H_
#define KVTIER_ENGINE_EVAL_METRICS_H_

// Pure helpers of the evaluation: fidelity per step, answers, questions, bootstrap intervals.
// Thread-compatible.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::engine {

// KL(p ‖ q) of the softmax distributions of two logit vectors, in nats, accumulated in double.
// Exactly 0 when the vectors are bitwise equal. REQUIRES: equal, non-zero sizes.
double KlDivergence(std::span<const float> p_logits, std::span<const float> q_logits);

// Index of the largest logit (the first on ties).
int32_t Argmax(std::span<const float> logits);
// Greedy choice that skips `banned` ids (end-of-sequence held back until a minimum length).
int32_t ArgmaxExcept(std::span<const float> logits, std::span<const int32_t> banned);

// The last number in `text` ("1,234.50" -> "1234.5", "-3" -> "-3"), normalised so that equal
// values compare equal as strings; "" when there is none.
std::string LastNumber(const std::string& text);
// GSM8K's final answer: the number after the last "#### " (normalised like LastNumber); ""
// when the marker is absent.
std::string GoldAnswer(const std::string& answer);

struct Question {
  uint64_t line = 0;  // 1-based line in the file
  std::string question;
  std::string answer;  // "" when the file has none
};

// Reads JSONL with a string "question" (and optional "answer") per non-blank line.
// INVALID_ARGUMENT naming the file and the line for malformed JSON or a missing/empty
// question, or for a file without questions; NOT_FOUND when it cannot be read.
absl::StatusOr<std::vector<Question>> LoadQuestions(const std::string& path);

struct Interval {
  double mean = 0, lo = 0, hi = 0;
};
// Mean and 95% percentile bootstrap interval (`resamples` resamples, fixed seed).
Interval Bootstrap(std::span<const double> values, int resamples = 2000, uint64_t seed = 1);

// FNV-1a 64 of bytes; chained through `seed`.
uint64_t Fnv1a(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull);
// FNV-1a 64 of a whole file. NOT_FOUND when it cannot be read.
absl::StatusOr<uint64_t> HashFile(const std::string& path);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_METRICS_H_
