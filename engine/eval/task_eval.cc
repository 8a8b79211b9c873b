#include "engine/eval/task_eval.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status/status_macros.h"
#include "core/tiering/config.h"
#include "engine/eval/eval_sequence.h"
#include "engine/eval/fan_out_cache.h"
#include "engine/eval/grid.h"
#include "engine/eval/metrics.h"
#include "engine/eval/results_csv.h"
#include "engine/model.h"

namespace kvtier::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool IsEos(int32_t t) { return t == 0 || t == 2; }  // <|endoftext|>, <|im_end|>

const char* kColumns[] = {"item",
                          "task",
                          "length",
                          "depth",
                          "regime",
                          "turn",
                          "config",
                          "policy",
                          "hbm_ratio",
                          "evict_ratio",
                          "compress_ratio",
                          "codec",
                          "prompt_tokens",
                          "cache_tokens",
                          "correct",
                          "full_correct",
                          "same_reply",
                          "t0_bytes",
                          "full_bytes",
                          "t0_fraction",
                          "ddr_bytes",
                          "compressed_bytes",
                          "evicted_fraction",
                          "reply"};

std::string Num(double v) { return absl::StrFormat("%.6g", v); }

// A reply as one CSV field: no commas, quotes or line breaks, at most 60 characters.
std::string Field(std::string s) {
  for (char& c : s) {
    if (c == ',' || c == '\n' || c == '\r' || c == '"') c = ' ';
  }
  return s.size() > 60 ? s.substr(0, 60) : s;
}

struct Member {
  EvalConfig config;
  std::unique_ptr<EvalSequence> seq;
  std::vector<float> logits;
  std::vector<int32_t> reply;
  bool active = true;
};

// Feeds `token` to every member (the same token: a question), or each active member its own
// greedy choice (an answer) when `token` < 0.
absl::Status Step(Model& model, std::vector<Member>& members, int32_t token) {
  std::vector<DecodeRequest> batch;
  std::vector<Member*> fed;
  for (Member& m : members) {
    if (token < 0 && !m.active) continue;
    batch.push_back({.token = token >= 0 ? token : m.reply.back(),
                     .cache = &m.seq->cache(),
                     .logits = &m.logits});
    fed.push_back(&m);
  }
  if (batch.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(model.Decode(batch));
  for (Member* m : fed) RETURN_IF_ERROR(m->seq->AfterStep());
  return absl::OkStatus();
}

// Greedy answer of every member, at most `max_new` tokens; each chosen token is fed (so a later
// turn follows the member's own reply).
absl::Status Answer(Model& model, std::vector<Member>& members, uint32_t max_new) {
  for (Member& m : members) {
    m.reply.clear();
    m.active = true;
  }
  for (uint32_t i = 0; i < max_new; ++i) {
    bool any = false;
    for (Member& m : members) {
      if (!m.active) continue;
      const int32_t t = Argmax(m.logits);
      if (IsEos(t)) {
        m.active = false;
        continue;
      }
      m.reply.push_back(t);
      any = true;
    }
    if (!any) break;
    RETURN_IF_ERROR(Step(model, members, -1));
  }
  return absl::OkStatus();
}

struct Run {
  TaskEvalOptions options;
  std::vector<EvalConfig> configs;  // [0] is the full cache
  std::vector<TaskItem> items;
};

absl::Status CheckProtectedSet(const Run& run, const TaskItem& item, uint64_t prompt,
                               uint64_t protected_begin) {
  const TaskEvalOptions& o = run.options;
  const uint64_t prompt_part = o.protect_prompt == "none" ? 0 : prompt - protected_begin;
  const uint64_t protect = prompt_part + o.window_tokens + o.sink_tokens;
  for (const EvalConfig& c : run.configs) {
    if (c.policy != "hierarchy") continue;
    const uint64_t budget = tiering::CeilRatio(c.hbm_ratio, prompt);
    if (budget < protect) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config \"", c.Name(), "\": hbm_ratio ", c.hbm_ratio, " holds ", budget, " of the ",
          prompt, " prompt tokens of item ", item.id, ", fewer than the protected set (", protect,
          " = prompt ", prompt_part, " (--protect-prompt ", o.protect_prompt,
          ") + --window-tokens ", o.window_tokens, " + --sink-tokens ", o.sink_tokens, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<std::string>>> EvaluateItem(Model& model,
                                                                   const TaskItem& item,
                                                                   const Run& run) {
  const TaskEvalOptions& o = run.options;
  const Tokenizer& tok = model.tokenizer();
  const TaskSegments seg = Segment(item, tok);
  const bool aware = o.regime == "aware";
  const uint32_t turns =
      aware ? 1 : std::min<uint32_t>(o.turns, static_cast<uint32_t>(item.questions.size()));
  std::vector<int32_t> prompt = seg.context;
  if (aware) prompt.insert(prompt.end(), seg.questions[0].begin(), seg.questions[0].end());
  uint64_t total = seg.context.size();
  for (uint32_t t = 0; t < turns; ++t) total += seg.questions[t].size() + item.max_new_tokens + 1;
  if (total > model.config().context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", item.id, ": field \"length\": the conversation takes ", total,
                     " tokens, beyond the model's context of ", model.config().context_length));
  }
  const uint64_t protected_begin = o.protect_prompt == "last-turn" ? seg.last_user_turn_begin : 0;
  RETURN_IF_ERROR(CheckProtectedSet(run, item, prompt.size(), protected_begin));
  EvalContext ctx(model.attention_shape(), {.page_tokens = o.page_tokens,
                                            .retier_interval = o.retier_interval,
                                            .window_tokens = o.window_tokens,
                                            .sink_tokens = o.sink_tokens,
                                            .protect_prompt = o.protect_prompt != "none"});
  std::vector<Member> members(run.configs.size());
  std::vector<worker::AttentionCache*> caches;
  for (size_t i = 0; i < members.size(); ++i) {
    members[i].config = run.configs[i];
    ASSIGN_OR_RETURN(members[i].seq, ctx.Open(run.configs[i], prompt.size(), protected_begin));
    caches.push_back(&members[i].seq->cache());
  }
  FanOutCache fan(std::move(caches));
  fan.set_out_floats(prompt.size() * model.attention_shape().num_q_heads *
                     model.attention_shape().head_dim);
  RETURN_IF_ERROR(model.Prefill(prompt, fan, &members[0].logits));
  for (Member& m : members) {
    m.logits = members[0].logits;
    RETURN_IF_ERROR(m.seq->AfterPrefill());
  }
  std::vector<std::vector<std::string>> rows;
  for (uint32_t turn = 0; turn < turns; ++turn) {
    if (turn > 0) {
      for (Member& m : members) RETURN_IF_ERROR(m.seq->BetweenTurns());
    }
    if (!aware) {
      for (int32_t token : seg.questions[turn]) RETURN_IF_ERROR(Step(model, members, token));
    }
    RETURN_IF_ERROR(Answer(model, members, item.max_new_tokens));
    const std::vector<std::string>& gold = item.questions[turn].answers;
    const std::string full_reply = tok.Decode(members[0].reply, false);
    const bool full_correct = Matches(full_reply, gold);
    for (Member& m : members) {
      const std::string reply = tok.Decode(m.reply, false);
      const EvalCost cost = m.seq->Cost();
      const EvalConfig& c = m.config;
      rows.push_back({item.id,
                      item.task,
                      std::to_string(item.length),
                      Num(item.depth),
                      o.regime,
                      std::to_string(turn),
                      c.policy == "full" ? "full" : c.Name(),
                      c.policy,
                      Num(c.hbm_ratio),
                      Num(c.evict_ratio),
                      Num(c.compress_ratio),
                      c.codec,
                      std::to_string(prompt.size()),
                      std::to_string(m.seq->cache().Length(0)),
                      Matches(reply, gold) ? "1" : "0",
                      full_correct ? "1" : "0",
                      m.reply == members[0].reply ? "1" : "0",
                      Num(cost.t0_now_bytes),
                      Num(cost.full_now_bytes),
                      Num(cost.full_now_bytes > 0 ? cost.t0_now_bytes / cost.full_now_bytes : 1),
                      std::to_string(cost.ddr_bytes),
                      std::to_string(cost.compressed_bytes),
                      Num(cost.evicted_fraction),
                      Field(reply)});
    }
  }
  return rows;
}

uint64_t TasksHash(const std::vector<TaskItem>& items) {
  uint64_t h = Fnv1a("tasks");
  for (const TaskItem& item : items) h = Fnv1a(TaskJson(item), h);
  return h;
}

nlohmann::json Identity(const Run& run, uint64_t model_hash) {
  std::vector<std::string> names;
  for (const EvalConfig& c : run.configs) names.push_back(c.Name());
  const TaskEvalOptions& o = run.options;
  return {{"configs", names},
          {"model_hash", absl::StrFormat("%016x", model_hash)},
          {"tasks_hash", absl::StrFormat("%016x", TasksHash(run.items))},
          {"regime", o.regime},
          {"turns", o.turns},
          {"page_tokens", o.page_tokens},
          {"retier_interval", o.retier_interval},
          {"window_tokens", o.window_tokens},
          {"sink_tokens", o.sink_tokens},
          {"protect_prompt", o.protect_prompt}};
}

// Checks OUT against this run; returns the items complete there (rows of an item cut short
// by an interruption are dropped).
absl::StatusOr<std::set<std::string>> PrepareOut(const Run& run, const nlohmann::json& identity) {
  const fs::path out(run.options.out_dir), id_path = out / "run.json",
                                           results = out / "results.csv";
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--out ", out.string(), ": ", ec.message()));
  if (std::ifstream in(id_path); in) {
    nlohmann::json old = nlohmann::json::parse(in, nullptr, false);
    for (auto& [key, value] : identity.items()) {
      if (old.is_discarded() || !old.contains(key) || old[key] != value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--out ", out.string(), " holds a different run (", key,
                         " differs); nothing was changed: use another --out"));
      }
    }
  } else if (fs::exists(results)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", out.string(), " holds results.csv without run.json"));
  }
  std::set<std::string> done;
  if (!fs::exists(results)) {
    std::ofstream(id_path) << identity.dump(2) << "\n";
    std::ofstream(results) << absl::StrJoin(kColumns, ",") << "\n";
    return done;
  }
  std::map<std::string, uint32_t> expected;
  for (const TaskItem& item : run.items) {
    const uint32_t turns = run.options.regime == "aware"
                               ? 1
                               : std::min<uint32_t>(run.options.turns, item.questions.size());
    expected[item.id] = turns * run.configs.size();
  }
  return KeepCompleteGroups<std::string>(
      results, std::size(kColumns), [](const std::string& f) { return f; },
      [&expected](const std::string& id, size_t rows) {
        auto it = expected.find(id);
        return it != expected.end() && rows == it->second;
      });
}

absl::Status Validate(const TaskEvalOptions& o) {
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.regime != "aware" && o.regime != "agnostic") {
    return absl::InvalidArgumentError(
        absl::StrCat("--regime \"", o.regime, "\" is unknown (aware | agnostic)"));
  }
  if (o.protect_prompt != "none" && o.protect_prompt != "all" && o.protect_prompt != "last-turn") {
    return absl::InvalidArgumentError(absl::StrCat("--protect-prompt \"", o.protect_prompt,
                                                   "\" is unknown (none | all | last-turn)"));
  }
  if (o.turns == 0) return absl::InvalidArgumentError("--turns must be positive");
  if (o.page_tokens == 0 || o.retier_interval == 0 || o.threads <= 0) {
    return absl::InvalidArgumentError(
        "--page-tokens, --retier-interval and --threads must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

Wilson WilsonInterval(uint64_t correct, uint64_t n) {
  if (n == 0) return {0, 0, 1};
  const double z = 1.959963984540054, p = double(correct) / n, z2n = z * z / n;
  const double center = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / n + z2n / (4.0 * n));
  return {p, std::max(0.0, center - half), std::min(1.0, center + half)};
}

absl::Status RunTaskEval(const TaskEvalOptions& options) {
  Run run;
  run.options = options;
  const TaskEvalOptions& o = run.options;
  RETURN_IF_ERROR(Validate(o));
  run.configs.push_back({.policy = "full"});
  if (o.grid != "none") {
    ASSIGN_OR_RETURN(std::vector<EvalConfig> grid, MakeGrid(o.grid));
    run.configs.insert(run.configs.end(), grid.begin(), grid.end());
  }
  for (const std::string& spec : o.configs) {
    ASSIGN_OR_RETURN(EvalConfig c, ParseConfig(spec));
    run.configs.push_back(c);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(o.model_path, {.threads = o.threads}));
  if (o.tasks_file.empty()) {
    ASSIGN_OR_RETURN(run.items,
                     GenerateTasks(o.spec, model->tokenizer(), model->config().context_length));
  } else {
    ASSIGN_OR_RETURN(run.items, LoadTasks(o.tasks_file));
  }
  ASSIGN_OR_RETURN(uint64_t model_hash, HashFile(o.model_path));
  ASSIGN_OR_RETURN(std::set<std::string> done, PrepareOut(run, Identity(run, model_hash)));
  const fs::path results = fs::path(o.out_dir) / "results.csv";
  const auto start = Clock::now();
  size_t todo = 0, finished = 0;
  for (const TaskItem& item : run.items) todo += !done.contains(item.id);
  if (o.progress && !done.empty()) {
    std::fprintf(stderr, "resuming: %zu of %zu items already in %s\n", done.size(),
                 run.items.size(), o.out_dir.c_str());
  }
  for (const TaskItem& item : run.items) {
    if (done.contains(item.id)) continue;
    ASSIGN_OR_RETURN(auto rows, EvaluateItem(*model, item, run));
    std::string text;
    for (const auto& r : rows) absl::StrAppend(&text, absl::StrJoin(r, ","), "\n");
    std::ofstream out(results, std::ios::app);
    out << text;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot append to ", results.string()));
    ++finished;
    if (o.progress) {
      const double el = Since(start), eta = el / finished * (todo - finished);
      std::fprintf(stderr, "\ritems %zu/%zu  elapsed %dm%02ds  ETA %dm%02ds   ", finished, todo,
                   int(el) / 60, int(el) % 60, int(eta) / 60, int(eta) % 60);
      std::fflush(stderr);
    }
  }
  if (o.progress) std::fprintf(stderr, "\n");
  return WriteTaskSummary(o.out_dir);
}

absl::Status WriteTaskSummary(const std::string& out_dir) {
  const fs::path dir(out_dir);
  std::ifstream in(dir / "results.csv");
  if (!in) return absl::NotFoundError(absl::StrCat("no results.csv in ", out_dir));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header = absl::StrSplit(line, ',');
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  struct Cell {
    uint64_t n = 0, correct = 0, full_correct = 0, kept = 0;
    double t0 = 0, full = 0, ddr = 0, comp = 0, evicted = 0;
  };
  // (task, length, regime) -> config -> cell; configs in first-seen order.
  std::map<std::tuple<std::string, int, std::string>, std::map<std::string, Cell>> cells;
  std::vector<std::string> order;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() != header.size()) continue;
    const std::string config = f[col["config"]];
    if (std::find(order.begin(), order.end(), config) == order.end()) order.push_back(config);
    Cell& c = cells[{f[col["task"]], std::stoi(f[col["length"]]), f[col["regime"]]}][config];
    const bool ok = f[col["correct"]] == "1", full_ok = f[col["full_correct"]] == "1";
    ++c.n;
    c.correct += ok;
    c.full_correct += full_ok;
    c.kept += ok && full_ok;
    c.t0 += std::stod(f[col["t0_bytes"]]);
    c.full += std::stod(f[col["full_bytes"]]);
    c.ddr += std::stod(f[col["ddr_bytes"]]);
    c.comp += std::stod(f[col["compressed_bytes"]]);
    c.evicted += std::stod(f[col["evicted_fraction"]]);
  }
  std::string md = absl::StrCat(
      "# Retrieval accuracy (kvtier-run eval --tasks)\n\n"
      "Accuracy with its 95% Wilson interval; retention = share of the answers the full cache "
      "gets right that the configuration also gets right; bytes are means over answers (f32 KV) "
      "at the end of each answer; T0 share = T0 / full.\n");
  std::string csv =
      "task,length,regime,config,n,accuracy,lo,hi,retention,full_correct,t0_fraction,t0_bytes,"
      "ddr_bytes,compressed_bytes,evicted_fraction\n";
  for (const auto& [key, by_config] : cells) {
    const auto& [task, length, regime] = key;
    absl::StrAppendFormat(&md,
                          "\n## %s, %d tokens, question-%s\n\n| config | n | accuracy [95%%] | "
                          "retention | T0 share | T0 MiB | T1 MiB | T2 MiB | evicted |\n"
                          "|---|---|---|---|---|---|---|---|---|\n",
                          task, length, regime);
    for (const std::string& name : order) {
      auto it = by_config.find(name);
      if (it == by_config.end()) continue;
      const Cell& c = it->second;
      const Wilson w = WilsonInterval(c.correct, c.n);
      const double n = double(c.n), mib = 1 << 20;
      const double retention = c.full_correct ? double(c.kept) / c.full_correct : NAN;
      const double share = c.full > 0 ? c.t0 / c.full : 1;
      absl::StrAppendFormat(
          &md, "| %s | %d | %.2f [%.2f, %.2f]%s | %s | %.3f | %.2f | %.2f | %.2f | %.3f |\n", name,
          c.n, w.p, w.lo, w.hi, name == "full" ? (w.p >= 0.9 ? " passes" : " fails") : "",
          std::isnan(retention) ? "–" : absl::StrFormat("%.2f", retention), share, c.t0 / n / mib,
          c.ddr / n / mib, c.comp / n / mib, c.evicted / n);
      absl::StrAppendFormat(&csv,
                            "%s,%d,%s,%s,%d,%.6g,%.6g,%.6g,%.6g,%d,%.6g,%.6g,%.6g,%.6g,%.6g\n",
                            task, length, regime, name, c.n, w.p, w.lo, w.hi, retention,
                            c.full_correct, share, c.t0 / n, c.ddr / n, c.comp / n, c.evicted / n);
    }
  }
  std::ofstream(dir / "summary.md") << md;
  std::ofstream(dir / "summary.csv") << csv;
  return absl::OkStatus();
}

}  // namespace kvtier::engine
