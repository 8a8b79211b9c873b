#include "engine/eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status/status_macros.h"

namespace kvtier::engine {
namespace {

// The Landmark-attention passkey filler; RULER's needle tasks use the same noise.
constexpr char kFiller[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr char kMark[] = "\x01QUESTION\x01";
constexpr char kUserOpen[] = "<|im_start|>user\n";
constexpr char kTurnEnd[] = "<|im_end|>\n<|im_start|>assistant\n";
constexpr char kNextTurn[] = "<|im_end|>\n<|im_start|>user\n";

// splitmix64: portable, so a seed gives the same items everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Unit() { return (Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

constexpr const char* kWords[] = {
    "apple",  "river",   "candle",   "falcon",  "garden",  "hammer",  "island", "jacket",
    "kettle", "lantern", "meadow",   "needle",  "orchard", "pepper",  "quartz", "rabbit",
    "saddle", "ticket",  "umbrella", "violin",  "walnut",  "yogurt",  "zebra",  "anchor",
    "bridge", "cactus",  "dolphin",  "engine",  "feather", "glacier", "harbor", "igloo",
    "jungle", "koala",   "ladder",   "mirror",  "nectar",  "otter",   "pillow", "quiver",
    "rocket", "spider",  "tunnel",   "unicorn", "valley",  "window",  "yacht",  "zipper"};

std::string Digits(Rng& rng, int n) {
  std::string s(1, char('1' + rng.Below(9)));
  while (int(s.size()) < n) s.push_back(char('0' + rng.Below(10)));
  return s;
}

std::string Uuid(Rng& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 36; ++i) {
    s.push_back(i == 8 || i == 13 || i == 18 || i == 23 ? '-' : hex[rng.Below(16)]);
  }
  return s;
}

std::string VarName(Rng& rng) {
  std::string s;
  for (int i = 0; i < 5; ++i) s.push_back(char('A' + rng.Below(26)));
  return s;
}

// Distinct words from kWords.
std::vector<std::string> Words(Rng& rng, size_t n) {
  std::vector<std::string> all(std::begin(kWords), std::end(kWords));
  for (size_t i = 0; i < n; ++i) std::swap(all[i], all[i + rng.Below(all.size() - i)]);
  all.resize(n);
  return all;
}

struct Needle {
  double depth = 0;
  std::string text;
};

// What a task contributes; the haystack is `units(n)` filler units with needles at depths.
struct Draft {
  std::string intro, open, close;  // context = intro + open + haystack + close
  std::vector<Needle> needles;
  std::vector<TaskQuestion> questions;
  std::function<std::string(size_t)> unit;  // the i-th filler unit
  std::string separator = " ";
  uint32_t max_new_tokens = 16;
};

std::string Haystack(const Draft& d, size_t n) {
  std::vector<Needle> needles = d.needles;
  std::stable_sort(needles.begin(), needles.end(),
                   [](const Needle& a, const Needle& b) { return a.depth < b.depth; });
  std::vector<std::string> parts;
  size_t next = 0;
  for (size_t i = 0; i <= n; ++i) {
    while (next < needles.size() && std::llround(needles[next].depth * n) <= int64_t(i)) {
      parts.push_back(needles[next++].text);
    }
    if (i < n) parts.push_back(d.unit(i));
  }
  return absl::StrJoin(parts, d.separator);
}

constexpr char kNiahIntro[] =
    "Some special magic %ss are hidden within the following text. Make sure to memorize it. I "
    "will quiz you about the %ss afterwards.";

std::string MagicNeedle(const std::string& kind, const std::string& key, const std::string& v) {
  return absl::StrFormat("One of the special magic %ss for %s is: %s.", kind, key, v);
}

TaskQuestion MagicQuestion(const std::string& kind, const std::string& key,
                           const std::string& value) {
  return {
      absl::StrFormat("What is the special magic %s for %s mentioned in the provided text?", kind,
                      key),
      absl::StrFormat("The special magic %s for %s mentioned in the provided text is", kind, key),
      {value}};
}

// Depths of `n` other needles, away from the asked one.
double OtherDepth(Rng& rng) { return 0.05 + 0.9 * rng.Unit(); }

absl::StatusOr<Draft> MakeDraft(const std::string& task, double depth, Rng& rng) {
  Draft d;
  d.unit = [](size_t) { return std::string(kFiller); };
  if (task == "passkey") {
    const std::string key = Digits(rng, 5);
    d.intro =
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "them. I will quiz you about the important information there.";
    d.open = "\n\n";
    d.needles = {{depth, absl::StrCat("The pass key is ", key, ". Remember it. ", key,
                                      " is the pass key.")}};
    d.questions = {{"What is the pass key?", "The pass key is", {key}}};
    d.max_new_tokens = 12;
  } else if (task == "niah_number" || task == "niah_uuid") {
    const bool uuid = task == "niah_uuid";
    const std::string kind = uuid ? "uuid" : "number", key = Words(rng, 1)[0];
    const std::string value = uuid ? Uuid(rng) : Digits(rng, 7);
    d.intro = absl::StrFormat(kNiahIntro, kind, kind);
    d.open = "\n\n";
    d.needles = {{depth, MagicNeedle(kind, key, value)}};
    d.questions = {MagicQuestion(kind, key, value)};
    d.max_new_tokens = uuid ? 40 : 16;
  } else if (task == "multikey") {
    // Four look-alike needles; each is asked in turn (question-agnostic, multi-turn), the
    // first at the item's depth.
    const std::vector<std::string> keys = Words(rng, 4);
    d.intro = absl::StrFormat(kNiahIntro, "number", "number");
    d.open = "\n\n";
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string value = Digits(rng, 7);
      d.needles.push_back(
          {i == 0 ? depth : OtherDepth(rng), MagicNeedle("number", keys[i], value)});
      d.questions.push_back(MagicQuestion("number", keys[i], value));
    }
    d.max_new_tokens = 16;
  } else if (task == "multivalue") {
    const std::string key = Words(rng, 1)[0];
    d.intro = absl::StrFormat(kNiahIntro, "number", "number");
    d.open = "\n\n";
    TaskQuestion q{
        absl::StrFormat(
            "What are all the special magic numbers for %s mentioned in the provided text?", key),
        absl::StrFormat("The special magic numbers for %s mentioned in the provided text are", key),
        {}};
    for (int i = 0; i < 4; ++i) {
      const std::string value = Digits(rng, 7);
      d.needles.push_back({i == 0 ? depth : OtherDepth(rng), MagicNeedle("number", key, value)});
      q.answers.push_back(value);
    }
    d.questions = {q};
    d.max_new_tokens = 48;
  } else if (task == "vartrack") {
    // Two chains of five assignments (one asked per turn), spread from the item's depth on.
    d.intro =
        "Memorize and track the chain(s) of variable assignment hidden in the following text.";
    d.open = "\n\n";
    std::set<std::string> used;
    for (int chain = 0; chain < 2; ++chain) {
      const std::string value = Digits(rng, 5);
      std::vector<std::string> names;
      while (names.size() < 5) {
        std::string n = VarName(rng);
        if (used.insert(n).second) names.push_back(n);
      }
      const double start = chain == 0 ? depth : OtherDepth(rng);
      for (size_t i = 0; i < names.size(); ++i) {
        const double at = std::min(1.0, start + (1.0 - start) * i / (2.0 * names.size()));
        d.needles.push_back(
            {at, i == 0 ? absl::StrCat("VAR ", names[0], " = ", value, ".")
                        : absl::StrCat("VAR ", names[i], " = VAR ", names[i - 1], ".")});
      }
      d.questions.push_back(
          {absl::StrCat("Find all variables that are assigned the value ", value,
                        " in the text above."),
           absl::StrCat("According to the chain(s) of variable assignment in the text above, 5 "
                        "variables are assigned the value ",
                        value, ", they are:"),
           names});
    }
    d.max_new_tokens = 32;
  } else if (task == "kv_json") {
    // The haystack is the JSON object itself; three of its keys are asked in turn.
    d.intro = "Extract the value corresponding to the specified key in the JSON object below.";
    d.open = "\n\nJSON data:\n{";
    d.close = "}";
    d.separator = ",\n ";
    const uint64_t seed = rng.Next();
    d.unit = [seed](size_t i) {
      Rng r(seed ^ (0x9e3779b97f4a7c15ull * (i + 1)));
      return absl::StrCat("\"", Uuid(r), "\": \"", Uuid(r), "\"");
    };
    for (int i = 0; i < 3; ++i) {
      const std::string key = Uuid(rng), value = Uuid(rng);
      d.needles.push_back(
          {i == 0 ? depth : OtherDepth(rng), absl::StrCat("\"", key, "\": \"", value, "\"")});
      d.questions.push_back(
          {absl::StrCat("Key: \"", key, "\"\nWhat is the value associated with the specified key?"),
           "The value associated with the specified key is:",
           {value}});
    }
    d.max_new_tokens = 40;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tasks: unknown task \"", task, "\" (known: ", absl::StrJoin(TaskNames(), ", "), ")"));
  }
  return d;
}

uint64_t ConversationTokens(const TaskItem& item, const Tokenizer& tok) {
  const TaskSegments s = Segment(item, tok);
  uint64_t n = s.context.size();
  for (const auto& q : s.questions) n += q.size() + item.max_new_tokens;
  return n;
}

std::string Context(const Draft& d, size_t units) {
  return absl::StrCat(d.intro, d.open, Haystack(d, units), d.close);
}

absl::StatusOr<TaskItem> MakeItem(const std::string& task, uint32_t length, uint32_t index,
                                  uint32_t items, uint64_t seed, const Tokenizer& tok) {
  const double depth = (index + 0.5) / items;
  Rng rng(seed ^ (uint64_t{std::hash<std::string>{}(task)} * 0x100000001b3ull) ^
          (uint64_t{length} << 32) ^ index);
  ASSIGN_OR_RETURN(Draft d, MakeDraft(task, depth, rng));
  TaskItem item{.id = absl::StrCat(task, "-", length, "-", index),
                .task = task,
                .length = length,
                .depth = depth,
                .questions = d.questions,
                .max_new_tokens = d.max_new_tokens};
  const auto tokens = [&](size_t units) {
    item.context = Context(d, units);
    return ConversationTokens(item, tok);
  };
  const uint64_t base = tokens(0);
  if (base > length) {
    return absl::InvalidArgumentError(absl::StrCat("--lengths: ", length, " is too short for ",
                                                   task, " (its questions alone take ", base,
                                                   " tokens)"));
  }
  // Linear estimate from two measurements, then walk to the largest count that fits.
  const size_t probe = 64;
  const double per = std::max(1.0, double(tokens(probe) - base) / probe);
  size_t n = size_t((length - base) / per);
  while (n > 0 && tokens(n) > length) --n;
  while (tokens(n + 1) <= length) ++n;
  item.context = Context(d, n);
  return item;
}

bool WordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

const std::vector<std::string>& TaskNames() {
  static const std::vector<std::string> names = {
      "passkey", "niah_number", "niah_uuid", "multikey", "multivalue", "vartrack", "kv_json"};
  return names;
}

absl::StatusOr<std::vector<std::string>> ParseTaskNames(const std::string& csv) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    const std::string name(absl::StripAsciiWhitespace(part));
    if (name == "all") {
      out.insert(out.end(), TaskNames().begin(), TaskNames().end());
      continue;
    }
    if (std::find(TaskNames().begin(), TaskNames().end(), name) == TaskNames().end()) {
      return absl::InvalidArgumentError(absl::StrCat("--tasks: unknown task \"", name,
                                                     "\" (known: all, ",
                                                     absl::StrJoin(TaskNames(), ", "), ")"));
    }
    out.push_back(name);
  }
  if (out.empty()) return absl::InvalidArgumentError("--tasks is empty");
  return out;
}

absl::StatusOr<std::vector<uint32_t>> ParseLengths(const std::string& csv) {
  std::vector<uint32_t> out;
  for (absl::string_view part : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(part));
    uint32_t scale = 1;
    if (!s.empty() && s.back() == 'k') {
      scale = 1024;
      s.pop_back();
    }
    uint32_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v == 0 || v > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lengths: \"", part, "\" is not a token count (e.g. 1k, 2048)"));
    }
    out.push_back(v * scale);
  }
  if (out.empty()) return absl::InvalidArgumentError("--lengths is empty");
  return out;
}

absl::StatusOr<std::vector<TaskItem>> GenerateTasks(const TaskSpec& spec, const Tokenizer& tok,
                                                    uint32_t context_length) {
  if (spec.items == 0) return absl::InvalidArgumentError("--items must be positive");
  std::vector<TaskItem> out;
  for (const std::string& task : spec.tasks) {
    for (uint32_t length : spec.lengths) {
      if (length > context_length) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--lengths: ", length, " exceeds the model's context of ", context_length, " tokens"));
      }
      for (uint32_t i = 0; i < spec.items; ++i) {
        ASSIGN_OR_RETURN(TaskItem item, MakeItem(task, length, i, spec.items, spec.seed, tok));
        out.push_back(std::move(item));
      }
    }
  }
  return out;
}

std::string TaskJson(const TaskItem& item) {
  nlohmann::json qs = nlohmann::json::array();
  for (const TaskQuestion& q : item.questions) {
    qs.push_back(
        {{"question", q.question}, {"answer_prefix", q.answer_prefix}, {"answers", q.answers}});
  }
  return nlohmann::json{{"id", item.id},
                        {"task", item.task},
                        {"length", item.length},
                        {"depth", item.depth},
                        {"max_new_tokens", item.max_new_tokens},
                        {"context", item.context},
                        {"questions", qs}}
      .dump();
}

absl::StatusOr<std::vector<TaskItem>> LoadTasks(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read task file ", path));
  std::vector<TaskItem> out;
  std::string line;
  std::set<std::string> ids;
  for (uint64_t n = 1; std::getline(in, line); ++n) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", what));
    };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    TaskItem item;
    for (const char* field : {"id", "task", "context"}) {
      if (!j.contains(field) || !j[field].is_string() || j[field].get<std::string>().empty()) {
        return bad(absl::StrCat("field \"", field, "\" must be a non-empty string"));
      }
    }
    item.id = j["id"];
    item.task = j["task"];
    item.context = j["context"];
    if (!ids.insert(item.id).second) return bad(absl::StrCat("id \"", item.id, "\" repeats"));
    if (!j.contains("max_new_tokens") || !j["max_new_tokens"].is_number_unsigned() ||
        j["max_new_tokens"].get<uint64_t>() == 0 || j["max_new_tokens"].get<uint64_t>() > 4096) {
      return bad("field \"max_new_tokens\" must be an integer in [1, 4096]");
    }
    item.max_new_tokens = j["max_new_tokens"];
    item.length = j.value("length", 0u);
    item.depth = j.value("depth", 0.0);
    if (!j.contains("questions") || !j["questions"].is_array() || j["questions"].empty()) {
      return bad("field \"questions\" must be a non-empty array");
    }
    for (size_t i = 0; i < j["questions"].size(); ++i) {
      const nlohmann::json& q = j["questions"][i];
      const std::string where = absl::StrCat("questions[", i, "]");
      if (!q.is_object() || !q.contains("question") || !q["question"].is_string()) {
        return bad(absl::StrCat("field \"", where, ".question\" must be a string"));
      }
      if (!q.contains("answers") || !q["answers"].is_array() || q["answers"].empty()) {
        return bad(absl::StrCat("field \"", where, ".answers\" must be a non-empty array"));
      }
      if (q.contains("answer_prefix") && !q["answer_prefix"].is_string()) {
        return bad(absl::StrCat("field \"", where, ".answer_prefix\" must be a string"));
      }
      TaskQuestion tq{
          q["question"].get<std::string>(), q.value("answer_prefix", std::string()), {}};
      for (const auto& a : q["answers"]) {
        if (!a.is_string() || a.get<std::string>().empty()) {
          return bad(absl::StrCat("field \"", where, ".answers\" must hold non-empty strings"));
        }
        tq.answers.push_back(a);
      }
      item.questions.push_back(std::move(tq));
    }
    out.push_back(std::move(item));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no task"));
  return out;
}

TaskSegments Segment(const TaskItem& item, const Tokenizer& tok) {
  const std::vector<ChatMessage> messages = {{"user", absl::StrCat(item.context, "\n\n", kMark)}};
  const std::string text = ApplyChatTemplate(messages, /*add_generation_prompt=*/false);
  const size_t user = text.find(kUserOpen), mark = text.find(kMark);
  TaskSegments s;
  s.context = tok.Encode(text.substr(0, user));
  s.last_user_turn_begin = s.context.size();
  const std::vector<int32_t> turn = tok.Encode(text.substr(user, mark - user));
  s.context.insert(s.context.end(), turn.begin(), turn.end());
  for (size_t i = 0; i < item.questions.size(); ++i) {
    const TaskQuestion& q = item.questions[i];
    s.questions.push_back(
        tok.Encode(absl::StrCat(i == 0 ? "" : kNextTurn, q.question, kTurnEnd, q.answer_prefix)));
  }
  return s;
}

bool Matches(const std::string& reply, const std::vector<std::string>& answers) {
  const std::string hay = absl::AsciiStrToLower(reply);
  for (const std::string& a : answers) {
    const std::string needle = absl::AsciiStrToLower(a);
    bool found = false;
    for (size_t at = hay.find(needle); at != std::string::npos && !found;
         at = hay.find(needle, at + 1)) {
      const size_t end = at + needle.size();
      found = (at == 0 || !WordChar(hay[at - 1])) && (end == hay.size() || !WordChar(hay[end]));
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace kvtier::engine
