#include "engine/eval/eval.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status/status_macros.h"
#include "engine/eval/eval_sequence.h"
#include "engine/eval/fan_out_cache.h"
#include "engine/eval/metrics.h"
#include "engine/eval/results_csv.h"
#include "engine/model.h"

namespace kvtier::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr int32_t kEos[] = {0, 2};  // <|endoftext|>, <|im_end|>

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool IsEos(int32_t t) { return t == kEos[0] || t == kEos[1]; }

// Greedy choice at generated position `pos`: end-of-sequence is held back below min.
int32_t Choose(const std::vector<float>& logits, uint64_t pos, uint32_t min_new) {
  return pos < min_new ? ArgmaxExcept(logits, kEos) : Argmax(logits);
}

const char* kColumns[] = {"line",
                          "config",
                          "policy",
                          "hbm_ratio",
                          "evict_ratio",
                          "compress_ratio",
                          "codec",
                          "page_tokens",
                          "prompt_tokens",
                          "ref_tokens",
                          "ref_natural_end",
                          "min_new_tokens",
                          "max_new_tokens",
                          "top1_agreement",
                          "kl_mean",
                          "kl_max",
                          "fr_tokens",
                          "identical_prefix",
                          "identical_chain",
                          "ref_answer",
                          "fr_answer",
                          "gold_answer",
                          "same_answer",
                          "fr_correct",
                          "ref_correct",
                          "evicted_fraction",
                          "lost_mass_peak",
                          "t0_peak_bytes",
                          "t0_mean_bytes",
                          "full_peak_bytes",
                          "full_mean_bytes",
                          "t0_peak_ratio",
                          "t0_mean_ratio",
                          "ddr_bytes",
                          "compressed_bytes",
                          "offload_bytes",
                          "compress_bytes",
                          "promote_bytes",
                          "decompress_bytes",
                          "tier_seconds",
                          "question_seconds"};

std::string Num(double v) { return absl::StrFormat("%.9g", v); }

struct Reference {
  std::vector<int32_t> tokens;
  int64_t natural_end = -1;  // first position where the model wanted to stop (-1: never)
};

struct Shared {
  EvalOptions options;
  std::vector<EvalConfig> configs;
  std::vector<Question> questions;  // the selected ones
  uint64_t model_hash = 0;
  std::string reference_dir;
  std::mutex mu;  // results file, progress line
  std::atomic<uint64_t> steps_done{0};
  uint64_t steps_total = 0;
  std::atomic<uint32_t> next{0};
  std::atomic<uint32_t> finished{0};
  uint32_t to_run = 0;
  Clock::time_point start = Clock::now();
  absl::Status error;  // first error (guarded by mu)
};

void PrintProgress(Shared& s, bool final) {
  if (!s.options.progress) return;
  const double done = s.steps_done.load(), total = std::max<double>(1, s.steps_total);
  const double frac = std::min(1.0, done / total), elapsed = Since(s.start);
  const int width = 30, fill = static_cast<int>(frac * width);
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  std::fprintf(stderr, "\r[%s%s] %5.1f%%  questions %u/%u  elapsed %dm%02ds  ETA %dm%02ds   %s",
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), 100 * frac,
               s.finished.load(), s.to_run, int(elapsed) / 60, int(elapsed) % 60, int(eta) / 60,
               int(eta) % 60, final ? "\n" : "");
  std::fflush(stderr);
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

absl::StatusOr<Reference> LoadOrComputeReference(Model& model, EvalContext& ctx,
                                                 const std::vector<int32_t>& prompt,
                                                 const std::string& prompt_text, Shared& s) {
  const EvalOptions& o = s.options;
  uint64_t key = Fnv1a(prompt_text, s.model_hash);
  key = Fnv1a(absl::StrCat("|", o.min_new_tokens, "|", o.max_new_tokens), key);
  const fs::path path = fs::path(s.reference_dir) / (Hex(key) + ".json");
  if (std::ifstream in(path); in) {
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.contains("tokens") && j.contains("natural_end")) {
      return Reference{j["tokens"].get<std::vector<int32_t>>(), j["natural_end"].get<int64_t>()};
    }
  }
  ASSIGN_OR_RETURN(auto seq, ctx.Open({.policy = "full"}, prompt.size()));
  std::vector<float> logits;
  RETURN_IF_ERROR(model.Prefill(prompt, seq->cache(), &logits));
  Reference ref;
  while (ref.tokens.size() < o.max_new_tokens) {
    const int32_t want = Argmax(logits);
    if (IsEos(want) && ref.natural_end < 0) ref.natural_end = ref.tokens.size();
    const int32_t token = Choose(logits, ref.tokens.size(), o.min_new_tokens);
    if (IsEos(token)) break;
    ref.tokens.push_back(token);
    if (ref.tokens.size() == o.max_new_tokens) break;
    DecodeRequest r{.token = token, .cache = &seq->cache(), .logits = &logits};
    RETURN_IF_ERROR(model.Decode({&r, 1}));
  }
  nlohmann::json j = {{"tokens", ref.tokens},
                      {"natural_end", ref.natural_end},
                      {"model_hash", Hex(s.model_hash)},
                      {"min_new_tokens", o.min_new_tokens},
                      {"max_new_tokens", o.max_new_tokens}};
  const fs::path tmp = path.string() + ".tmp" +
                       std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  std::ofstream(tmp) << j.dump();
  fs::rename(tmp, path);
  return ref;
}

struct Member {
  std::unique_ptr<EvalSequence> seq;
  std::vector<float> logits;
  // Teacher-forced.
  uint64_t agree = 0, steps = 0;
  double kl_sum = 0, kl_max = 0;
  // Free-running.
  std::vector<int32_t> tokens;
  bool active = true;
  int64_t natural_end = -1;
};

std::string AnswerOf(const Tokenizer& tok, const std::vector<int32_t>& tokens, int64_t end) {
  const size_t n = end < 0 ? tokens.size() : std::min<size_t>(end, tokens.size());
  return LastNumber(tok.Decode(std::vector<int32_t>(tokens.begin(), tokens.begin() + n), false));
}

// Advances every member by one position; returns false when nothing is left to decode.
absl::StatusOr<bool> Step(Model& model, const Reference& ref, uint64_t s, std::vector<Member>& tf,
                          std::vector<Member>& fr, Shared& sh) {
  const EvalOptions& o = sh.options;
  const uint64_t n = ref.tokens.size();
  std::vector<DecodeRequest> batch;
  if (s < n) {
    const std::vector<float>& full = tf[0].logits;
    const int32_t want = Choose(full, s, o.min_new_tokens);
    if (want != ref.tokens[s]) {
      return absl::InternalError(absl::StrFormat(
          "the full-cache run chose token %d at step %d, the cached reference %d: delete %s", want,
          s, ref.tokens[s], sh.reference_dir));
    }
    for (size_t i = 1; i < tf.size(); ++i) {
      Member& m = tf[i];
      ++m.steps;
      m.agree += Choose(m.logits, s, o.min_new_tokens) == want;
      const double kl = KlDivergence(full, m.logits);
      m.kl_sum += kl;
      m.kl_max = std::max(m.kl_max, kl);
    }
    if (s + 1 < n) {
      for (Member& m : tf) {
        batch.push_back({.token = ref.tokens[s], .cache = &m.seq->cache(), .logits = &m.logits});
      }
    }
  }
  for (Member& m : fr) {
    if (!m.active) continue;
    const uint64_t pos = m.tokens.size();
    if (IsEos(Argmax(m.logits)) && m.natural_end < 0) m.natural_end = pos;
    const int32_t token = Choose(m.logits, pos, o.min_new_tokens);
    if (IsEos(token)) {
      m.active = false;
      continue;
    }
    m.tokens.push_back(token);
    if (m.tokens.size() >= o.max_new_tokens) {
      m.active = false;
      continue;
    }
    batch.push_back({.token = token, .cache = &m.seq->cache(), .logits = &m.logits});
  }
  if (batch.empty()) return false;
  RETURN_IF_ERROR(model.Decode(batch));
  for (Member& m : tf) {
    if (s + 1 < n) RETURN_IF_ERROR(m.seq->AfterStep());
  }
  for (Member& m : fr) {
    if (m.active) RETURN_IF_ERROR(m.seq->AfterStep());
  }
  return true;
}

std::vector<std::string> Row(const Question& q, const EvalConfig& c, const Member& tf,
                             const Member& fr, const Reference& ref, uint64_t prompt_tokens,
                             const std::string& ref_answer, const std::string& gold,
                             const std::string& fr_answer, double seconds, const EvalOptions& o) {
  const EvalCost cost = tf.seq->Cost();
  size_t prefix = 0;
  while (prefix < fr.tokens.size() && prefix < ref.tokens.size() &&
         fr.tokens[prefix] == ref.tokens[prefix]) {
    ++prefix;
  }
  const bool chain = fr.tokens == ref.tokens;
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  return {std::to_string(q.line),
          c.Name(),
          c.policy,
          Num(c.hbm_ratio),
          Num(c.evict_ratio),
          Num(c.compress_ratio),
          c.codec,
          std::to_string(o.page_tokens),
          std::to_string(prompt_tokens),
          std::to_string(ref.tokens.size()),
          std::to_string(ref.natural_end),
          std::to_string(o.min_new_tokens),
          std::to_string(o.max_new_tokens),
          Num(tf.steps ? double(tf.agree) / tf.steps : 1.0),
          Num(tf.steps ? tf.kl_sum / tf.steps : 0.0),
          Num(tf.kl_max),
          std::to_string(fr.tokens.size()),
          std::to_string(prefix),
          chain ? "1" : "0",
          ref_answer,
          fr_answer,
          gold,
          fr_answer == ref_answer ? "1" : "0",
          !gold.empty() && fr_answer == gold ? "1" : "0",
          !gold.empty() && ref_answer == gold ? "1" : "0",
          Num(cost.evicted_generated_fraction),
          Num(cost.lost_mass_peak),
          Num(cost.t0_peak_bytes),
          Num(cost.t0_mean_bytes),
          Num(cost.full_peak_bytes),
          Num(cost.full_mean_bytes),
          Num(ratio(cost.t0_peak_bytes, cost.full_peak_bytes)),
          Num(ratio(cost.t0_mean_bytes, cost.full_mean_bytes)),
          std::to_string(cost.ddr_bytes),
          std::to_string(cost.compressed_bytes),
          std::to_string(cost.offload_bytes),
          std::to_string(cost.compress_bytes),
          std::to_string(cost.promote_bytes),
          std::to_string(cost.decompress_bytes),
          Num(cost.tier_seconds),
          Num(seconds)};
}

absl::StatusOr<std::vector<std::vector<std::string>>> EvaluateQuestion(Model& model,
                                                                       const Question& q,
                                                                       Shared& s) {
  const EvalOptions& o = s.options;
  const auto start = Clock::now();
  EvalContext ctx(model.attention_shape(), {.page_tokens = o.page_tokens,
                                            .retier_interval = o.retier_interval,
                                            .window_tokens = o.window_tokens});
  const std::string text = EvalPrompt(q.question);
  const std::vector<int32_t> prompt = model.tokenizer().Encode(text);
  if (prompt.size() + o.max_new_tokens > model.config().context_length) {
    return absl::InvalidArgumentError(absl::StrCat(o.questions, ":", q.line, ": the prompt (",
                                                   prompt.size(), " tokens) + --max-new-tokens ",
                                                   "exceeds the model's context"));
  }
  ASSIGN_OR_RETURN(Reference ref, LoadOrComputeReference(model, ctx, prompt, text, s));
  std::vector<Member> tf(s.configs.size() + 1), fr(s.configs.size());
  ASSIGN_OR_RETURN(tf[0].seq, ctx.Open({.policy = "full"}, prompt.size()));
  for (size_t i = 0; i < s.configs.size(); ++i) {
    ASSIGN_OR_RETURN(tf[i + 1].seq, ctx.Open(s.configs[i], prompt.size()));
    ASSIGN_OR_RETURN(fr[i].seq, ctx.Open(s.configs[i], prompt.size()));
  }
  // One prefill through the weights for every member: before the first re-tiering every
  // member holds the same full cache, so they attend alike (checked bit for bit).
  std::vector<worker::AttentionCache*> caches;
  for (std::vector<Member>* group : {&tf, &fr}) {
    for (Member& m : *group) caches.push_back(&m.seq->cache());
  }
  FanOutCache fan(std::move(caches));
  fan.set_out_floats(prompt.size() * model.attention_shape().num_q_heads *
                     model.attention_shape().head_dim);
  RETURN_IF_ERROR(model.Prefill(prompt, fan, &tf[0].logits));
  for (std::vector<Member>* group : {&tf, &fr}) {
    for (Member& m : *group) {
      m.logits = tf[0].logits;
      RETURN_IF_ERROR(m.seq->AfterPrefill());
    }
  }
  uint64_t reported = 0;
  for (uint64_t step = 0;; ++step) {
    ASSIGN_OR_RETURN(bool more, Step(model, ref, step, tf, fr, s));
    s.steps_done += 1;
    ++reported;
    if (s.options.progress && step % 8 == 0) {
      std::lock_guard<std::mutex> lock(s.mu);
      PrintProgress(s, false);
    }
    if (!more) break;
  }
  s.steps_done += o.max_new_tokens > reported ? o.max_new_tokens - reported : 0;
  const double seconds = Since(start);
  const Tokenizer& tok = model.tokenizer();
  const std::string ref_answer = AnswerOf(tok, ref.tokens, ref.natural_end);
  const std::string gold = GoldAnswer(q.answer);
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < s.configs.size(); ++i) {
    rows.push_back(Row(q, s.configs[i], tf[i + 1], fr[i], ref, prompt.size(), ref_answer, gold,
                       AnswerOf(tok, fr[i].tokens, fr[i].natural_end), seconds, o));
  }
  return rows;
}

absl::Status AppendRows(const fs::path& results,
                        const std::vector<std::vector<std::string>>& rows) {
  std::string text;
  for (const auto& r : rows) absl::StrAppend(&text, absl::StrJoin(r, ","), "\n");
  std::FILE* f = std::fopen(results.c_str(), "a");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot append to ", results.string()));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fflush(f);
  std::fclose(f);
  return ok ? absl::OkStatus()
            : absl::InternalError(absl::StrCat("short write to ", results.string()));
}

void Worker(Shared& s, const std::vector<uint32_t>& todo, int threads) {
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Load(s.options.model_path, {.threads = threads});
  const fs::path results = fs::path(s.options.out_dir) / "results.csv";
  for (;;) {
    const uint32_t i = s.next.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.error.ok() || i >= todo.size()) return;
      if (!model.ok()) {
        s.error = model.status();
        return;
      }
    }
    absl::StatusOr<std::vector<std::vector<std::string>>> rows =
        EvaluateQuestion(**model, s.questions[todo[i]], s);
    std::lock_guard<std::mutex> lock(s.mu);
    if (!rows.ok()) {
      if (s.error.ok()) s.error = rows.status();
      return;
    }
    absl::Status appended = AppendRows(results, *rows);
    if (!appended.ok() && s.error.ok()) s.error = appended;
    s.finished += 1;
    PrintProgress(s, false);
  }
}

// The identity of a run: what must match for results to be appended to an existing OUT. Rows
// are keyed by question line, so --offset / --limit may change (a run can be extended).
nlohmann::json RunIdentity(const Shared& s, uint64_t questions_hash) {
  std::vector<std::string> names;
  for (const EvalConfig& c : s.configs) names.push_back(c.Name());
  const EvalOptions& o = s.options;
  return {{"configs", names},
          {"model_hash", Hex(s.model_hash)},
          {"questions_hash", Hex(questions_hash)},
          {"min_new_tokens", o.min_new_tokens},
          {"max_new_tokens", o.max_new_tokens},
          {"page_tokens", o.page_tokens},
          {"retier_interval", o.retier_interval},
          {"window_tokens", o.window_tokens},
          {"prompt", EvalPrompt("{question}")}};
}

// Checks OUT against this run; returns the question lines already complete there, dropping
// the rows of a question cut short by an interruption.
absl::StatusOr<std::set<uint64_t>> PrepareOut(const Shared& s, const nlohmann::json& identity) {
  const fs::path out(s.options.out_dir), id_path = out / "run.json", results = out / "results.csv";
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--out ", out.string(), ": ", ec.message()));
  if (std::ifstream in(id_path); in) {
    nlohmann::json old = nlohmann::json::parse(in, nullptr, false);
    if (old.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(id_path.string(), " is not JSON; use another --out"));
    }
    for (auto& [key, value] : identity.items()) {
      if (!old.contains(key) || old[key] != value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--out ", out.string(), " holds a run with a different configuration (",
                         key, ": ", old.contains(key) ? old[key].dump() : "absent", " there, ",
                         value.dump(), " here); nothing was changed: use another --out"));
      }
    }
  } else if (fs::exists(results)) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", out.string(),
                                                   " holds results.csv without run.json; use "
                                                   "another --out"));
  }
  std::set<uint64_t> done;
  if (!fs::exists(results)) {
    std::ofstream(id_path) << identity.dump(2) << "\n";
    std::string header;
    for (const char* c : kColumns) absl::StrAppend(&header, header.empty() ? "" : ",", c);
    std::ofstream(results) << header << "\n";
    return done;
  }
  return KeepCompleteGroups<uint64_t>(
      results, std::size(kColumns), [](const std::string& f) { return std::stoull(f); },
      [&s](const uint64_t&, size_t rows) { return rows == s.configs.size(); });
}

}  // namespace

std::string EvalPrompt(const std::string& question) {
  std::vector<ChatMessage> messages = {
      {"user", absl::StrCat(question,
                            "\nSolve this step by step. End with the final answer as a number.")}};
  return ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
}

absl::Status RunEval(const EvalOptions& options) {
  auto s = std::make_unique<Shared>();
  s->options = options;
  EvalOptions& o = s->options;
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.max_new_tokens == 0) return absl::InvalidArgumentError("--max-new-tokens must be positive");
  if (o.min_new_tokens > o.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--min-new-tokens ", o.min_new_tokens,
                                                   " exceeds --max-new-tokens ", o.max_new_tokens));
  }
  if (o.page_tokens == 0 || o.retier_interval == 0 || o.jobs == 0 || o.threads <= 0) {
    return absl::InvalidArgumentError(
        "--page-tokens, --retier-interval, --jobs and --threads must be positive");
  }
  if (!o.grid.empty()) {
    ASSIGN_OR_RETURN(s->configs, MakeGrid(o.grid));
  }
  for (const std::string& spec : o.configs) {
    ASSIGN_OR_RETURN(EvalConfig c, ParseConfig(spec));
    s->configs.push_back(c);
  }
  if (s->configs.empty())
    return absl::InvalidArgumentError("no configuration: give --grid or --config");
  ASSIGN_OR_RETURN(std::vector<Question> all, LoadQuestions(o.questions));
  ASSIGN_OR_RETURN(uint64_t questions_hash, HashFile(o.questions));
  if (o.offset >= all.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--offset ", o.offset, " is past the ",
                                                   all.size(), " questions of ", o.questions));
  }
  const size_t end = o.limit == 0 ? all.size() : std::min<size_t>(all.size(), o.offset + o.limit);
  s->questions.assign(all.begin() + o.offset, all.begin() + end);
  ASSIGN_OR_RETURN(s->model_hash, HashFile(o.model_path));
  s->reference_dir =
      o.reference_dir.empty() ? (fs::path(o.out_dir) / "references").string() : o.reference_dir;
  ASSIGN_OR_RETURN(std::set<uint64_t> done, PrepareOut(*s, RunIdentity(*s, questions_hash)));
  fs::create_directories(s->reference_dir);
  std::vector<uint32_t> todo;
  for (uint32_t i = 0; i < s->questions.size(); ++i) {
    if (!done.contains(s->questions[i].line)) todo.push_back(i);
  }
  s->to_run = todo.size();
  s->steps_total = uint64_t{o.max_new_tokens} * todo.size();
  if (o.progress && !done.empty()) {
    std::fprintf(stderr, "resuming: %zu of %zu questions already in %s\n", done.size(),
                 s->questions.size(), o.out_dir.c_str());
  }
  const uint32_t jobs = std::max<uint32_t>(1, std::min<uint32_t>(o.jobs, todo.size()));
  const int threads = std::max(1, o.threads / static_cast<int>(jobs));
  std::vector<std::thread> workers;
  for (uint32_t j = 0; j < jobs; ++j) workers.emplace_back([&] { Worker(*s, todo, threads); });
  for (std::thread& t : workers) t.join();
  PrintProgress(*s, true);
  RETURN_IF_ERROR(s->error);
  return WriteSummary(o.out_dir);
}

}  // namespace kvtier::engine
