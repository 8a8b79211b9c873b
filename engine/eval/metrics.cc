#include "engine/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kvtier::engine {
namespace {

// log Σ exp(x) in double.
double LogSumExp(std::span<const float> x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double{v});
  double s = 0;
  for (float v : x) s += std::exp(double{v} - m);
  return m + std::log(s);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string Normalise(std::string number) {
  number = absl::StrReplaceAll(number, {{",", ""}});
  if (number.find('.') != std::string::npos) {
    while (!number.empty() && number.back() == '0') number.pop_back();
    if (!number.empty() && number.back() == '.') number.pop_back();
  }
  if (number == "-0" || number.empty() || number == "-") return number == "-0" ? "0" : number;
  return number;
}

}  // namespace

double KlDivergence(std::span<const float> p, std::span<const float> q) {
  const double lp = LogSumExp(p), lq = LogSumExp(q);
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double a = double{p[i]} - lp, b = double{q[i]} - lq;
    if (p[i] == q[i] && lp == lq) continue;  // identical term: exactly 0
    kl += std::exp(a) * (a - b);
  }
  return std::max(kl, 0.0);
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t ArgmaxExcept(std::span<const float> logits, std::span<const int32_t> banned) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::find(banned.begin(), banned.end(), static_cast<int32_t>(i)) != banned.end()) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

std::string LastNumber(const std::string& text) {
  // Scan backwards for the last digit, then extend over digits, ',' between digits and one '.'.
  size_t end = text.size();
  while (end > 0 && !IsDigit(text[end - 1])) --end;
  if (end == 0) return "";
  size_t begin = end;
  bool dot = false;
  while (begin > 0) {
    const char c = text[begin - 1];
    if (IsDigit(c)) {
      --begin;
    } else if ((c == ',' || (c == '.' && !dot)) && begin >= 2 && IsDigit(text[begin - 2])) {
      dot |= c == '.';
      --begin;
    } else {
      break;
    }
  }
  std::string number = text.substr(begin, end - begin);
  if (begin > 0 && text[begin - 1] == '-') number = "-" + number;
  return Normalise(number);
}

std::string GoldAnswer(const std::string& answer) {
  const size_t at = answer.rfind("####");
  if (at == std::string::npos) return "";
  return LastNumber(answer.substr(at + 4));
}

absl::StatusOr<std::vector<Question>> LoadQuestions(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --questions ", path));
  std::vector<Question> out;
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", number, ": ");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON object"));
    }
    auto q = j.find("question");
    if (q == j.end() || !q->is_string() || q->get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "needs a non-empty string field \"question\""));
    }
    Question item{.line = number, .question = q->get<std::string>()};
    auto a = j.find("answer");
    if (a != j.end()) {
      if (!a->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "\"answer\" is not a string"));
      }
      item.answer = a->get<std::string>();
    }
    out.push_back(std::move(item));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no questions"));
  return out;
}

Interval Bootstrap(std::span<const double> values, int resamples, uint64_t seed) {
  Interval r;
  if (values.empty()) return {NAN, NAN, NAN};
  double sum = 0;
  for (double v : values) sum += v;
  r.mean = sum / values.size();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  std::vector<double> means(resamples);
  for (int b = 0; b < resamples; ++b) {
    double s = 0;
    for (size_t i = 0; i < values.size(); ++i) s += values[pick(rng)];
    means[b] = s / values.size();
  }
  std::sort(means.begin(), means.end());
  r.lo = means[static_cast<size_t>(0.025 * (resamples - 1))];
  r.hi = means[static_cast<size_t>(0.975 * (resamples - 1))];
  return r;
}

uint64_t Fnv1a(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<uint64_t> HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  uint64_t h = 0xcbf29ce484222325ull;
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), buf.size());
    h = Fnv1a(std::string_view(buf.data(), in.gcount()), h);
  }
  return h;
}

}  // namespace kvtier::engine
