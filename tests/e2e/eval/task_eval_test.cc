// The quick profile of the retrieval evaluation on the real model (docs/evaluation.md): the
// hierarchy at r = 0 answers exactly what the full cache answers on every item and turn while
// T0 holds at most β of the tokens and the rest really left T0; the full cache passes the cell
// it is tested on; resume adds nothing; bad input is refused naming the field. Skips when the
// model file is absent.

#include "engine/eval/task_eval.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_split.h"
#include "engine/eval/tasks.h"
#include "engine/model.h"
#include "engine/model_path.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/csv_table.h"

namespace kvtier::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Table = kvtier::testing::CsvTable;
using kvtier::testing::ReadCsv;

class TaskEval : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(DefaultModelPath())) GTEST_SKIP() << MissingModelHint(DefaultModelPath());
    out_ = fs::temp_directory_path() / ("kvtier_task_eval_" + std::to_string(getpid()));
    fs::remove_all(out_);
    o_.model_path = DefaultModelPath();
    o_.out_dir = out_.string();
    o_.progress = false;
    o_.spec = {.tasks = {"niah_number", "multikey"}, .lengths = {1024}, .items = 1, .seed = 1};
    o_.regime = "agnostic";
    o_.turns = 2;
    o_.grid = "tasks-quick";
  }
  void TearDown() override { fs::remove_all(out_); }

  fs::path out_;
  TaskEvalOptions o_;
};

TEST_F(TaskEval, HierarchyAtZeroEvictionAnswersAsTheFullCache) {
  ASSERT_TRUE(RunTaskEval(o_).ok());
  const Table rows = ReadCsv(out_ / "results.csv");
  // niah_number: 1 item × 1 turn, multikey: 1 item × 2 turns; 7 configurations each.
  ASSERT_EQ(rows.size(), (1 + 2) * 7u);
  int exact = 0, full_multikey = 0;
  for (const auto& r : rows) {
    if (r.at("config") == "full" && r.at("task") == "multikey") {
      full_multikey += r.at("correct") == "1";
    }
    if (r.at("policy") != "hierarchy" || std::stod(r.at("evict_ratio")) != 0) continue;
    ++exact;
    EXPECT_EQ(r.at("same_reply"), "1") << r.at("config") << " " << r.at("item");
    EXPECT_EQ(r.at("correct"), r.at("full_correct")) << r.at("config") << " " << r.at("item");
    // T0 holds at most ceil(β × P) tokens (+ a page) at placement, plus what was written since.
    const double beta = std::stod(r.at("hbm_ratio"));
    const double P = std::stod(r.at("prompt_tokens")), L = std::stod(r.at("cache_tokens"));
    const double t0_tokens = std::stod(r.at("t0_fraction")) * L;
    EXPECT_LE(t0_tokens, std::ceil(beta * P) + 16 + (L - P) + 1e-6) << r.at("config");
    EXPECT_GT(std::stod(r.at("ddr_bytes")), 0) << "pages must really leave T0: " << r.at("config");
    EXPECT_EQ(std::stod(r.at("evicted_fraction")), 0);
  }
  EXPECT_EQ(exact, 3 * 3);
  // The cell the full cache is tested on: multikey at 1K, both turns.
  EXPECT_EQ(full_multikey, 2);
  // Eviction is reported whatever it scores: the baselines evicted something.
  for (const auto& r : rows) {
    if (r.at("policy") == "streaming" || r.at("policy") == "snapkv") {
      EXPECT_GT(std::stod(r.at("evicted_fraction")), 0.5) << r.at("config");
    }
  }
  // Resume: nothing is redone.
  ASSERT_TRUE(RunTaskEval(o_).ok());
  EXPECT_EQ(ReadCsv(out_ / "results.csv").size(), rows.size());
  EXPECT_TRUE(fs::exists(out_ / "summary.md"));
  EXPECT_TRUE(fs::exists(out_ / "summary.csv"));
  // A different run is refused without touching the results.
  TaskEvalOptions other = o_;
  other.window_tokens = 64;
  EXPECT_THAT(RunTaskEval(other).message(), HasSubstr("window_tokens"));
  EXPECT_EQ(ReadCsv(out_ / "results.csv").size(), rows.size());
}

TEST_F(TaskEval, BadInputNamesTheField) {
  TaskEvalOptions o = o_;
  o.protect_prompt = "all";  // the whole prompt cannot fit β = 0.1
  EXPECT_THAT(RunTaskEval(o).message(), HasSubstr("fewer than the protected set"));
  o = o_;
  o.spec.lengths = {9000};
  EXPECT_THAT(RunTaskEval(o).message(), HasSubstr("--lengths: 9000 exceeds the model's context"));
  o = o_;
  o.regime = "sideways";
  EXPECT_THAT(RunTaskEval(o).message(), HasSubstr("--regime"));
  o = o_;
  o.tasks_file = (out_ / "bad.jsonl").string();
  fs::create_directories(out_);
  std::ofstream(o.tasks_file) << R"({"id":"x","task":"t","context":"c"})"
                              << "\n";
  EXPECT_THAT(RunTaskEval(o).message(), HasSubstr("max_new_tokens"));
}

TEST_F(TaskEval, GeneratedLengthsFitAndTheRegimesShareTokens) {
  auto model = Model::Load(DefaultModelPath(), {.threads = 2});
  ASSERT_TRUE(model.ok());
  const Tokenizer& tok = (*model)->tokenizer();
  auto items = GenerateTasks({.tasks = TaskNames(), .lengths = {1024}, .items = 2, .seed = 9}, tok,
                             (*model)->config().context_length);
  ASSERT_TRUE(items.ok()) << items.status();
  for (const TaskItem& item : *items) {
    const TaskSegments s = Segment(item, tok);
    uint64_t n = s.context.size();
    for (const auto& q : s.questions) n += q.size() + item.max_new_tokens;
    EXPECT_LE(n, 1024u) << item.id;
    EXPECT_GT(n, 900u) << item.id;  // filled up to the length
    // Every answer is in the context.
    for (const TaskQuestion& q : item.questions) {
      for (const std::string& a : q.answers) EXPECT_THAT(item.context, HasSubstr(a)) << item.id;
    }
  }
  // Same seed, same items.
  auto again = GenerateTasks({.tasks = TaskNames(), .lengths = {1024}, .items = 2, .seed = 9}, tok,
                             (*model)->config().context_length);
  ASSERT_TRUE(again.ok());
  for (size_t i = 0; i < items->size(); ++i) {
    EXPECT_EQ(TaskJson((*items)[i]), TaskJson((*again)[i]));
  }
}

}  // namespace
}  // namespace kvtier::engine
