// The quick grid on the real model: the zero-error property through the whole evaluation
// (every r = 0, γ = 0 row is the full cache exactly, for every β), every row present, resume,
// and bad input. Uses GSM8K beside the repository when present, the project's own questions
// otherwise; skips when the model file is absent.

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_split.h"
#include "engine/eval/eval.h"
#include "engine/eval/grid.h"
#include "engine/model_path.h"
#include "gtest/gtest.h"
#include "tests/support/csv_table.h"

namespace kvtier::engine {
namespace {

namespace fs = std::filesystem;

std::string Questions() {
  return fs::exists(KVTIER_GSM8K) ? KVTIER_GSM8K : KVTIER_FIXTURE_DIR "/eval_questions.jsonl";
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using Table = kvtier::testing::CsvTable;
using kvtier::testing::ReadCsv;

class EvalQuick : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(DefaultModelPath())) GTEST_SKIP() << MissingModelHint(DefaultModelPath());
    out_ = fs::temp_directory_path() / ("kvtier_eval_quick_" + std::to_string(getpid()));
    fs::remove_all(out_);
    options_.model_path = DefaultModelPath();
    options_.questions = Questions();
    options_.grid = "quick";
    options_.out_dir = out_.string();
    options_.limit = 1;
    options_.max_new_tokens = 64;
    options_.min_new_tokens = 64;
    options_.page_tokens = 4;
    options_.retier_interval = 16;
    options_.window_tokens = 16;
    options_.progress = false;
    options_.threads = 1;  // see docs/evaluation.md: the engine pool's race under load
  }
  void TearDown() override {
    if (!out_.empty()) fs::remove_all(out_);
  }
  fs::path out_;
  EvalOptions options_;
};

TEST_F(EvalQuick, ZeroEvictionRowsAreTheFullCacheExactlyAndBadInputChangesNothing) {
  ASSERT_TRUE(RunEval(options_).ok());
  const Table rows = ReadCsv(out_ / "results.csv");
  auto grid = MakeGrid("quick");
  ASSERT_TRUE(grid.ok());
  ASSERT_EQ(rows.size(), grid->size());
  std::map<std::string, int> zero_by_beta;
  for (const auto& r : rows) {
    EXPECT_EQ(r.at("ref_tokens"), "64");
    if (r.at("policy") == "hierarchy" && std::stod(r.at("evict_ratio")) == 0 &&
        std::stod(r.at("compress_ratio")) == 0) {
      ++zero_by_beta[r.at("hbm_ratio")];
      EXPECT_EQ(r.at("top1_agreement"), "1") << r.at("config");
      EXPECT_EQ(r.at("kl_mean"), "0") << r.at("config");
      EXPECT_EQ(r.at("kl_max"), "0") << r.at("config");
      EXPECT_EQ(r.at("identical_prefix"), r.at("ref_tokens")) << r.at("config");
      EXPECT_EQ(r.at("identical_chain"), "1") << r.at("config");
      EXPECT_EQ(r.at("same_answer"), "1") << r.at("config");
      EXPECT_EQ(r.at("evicted_fraction"), "0");
      // HBM is a cost knob here: T0 really shrank below the full cache.
      EXPECT_LT(std::stod(r.at("t0_mean_ratio")), 1.0) << r.at("config");
    }
    if (r.at("policy") == "h2o" || r.at("policy") == "streaming" || r.at("policy") == "rkv") {
      // Equal HBM: they keep ceil(0.5 × length) positions per (layer, kv head) at every
      // re-tiering, plus what Δ steps append in between.
      EXPECT_LT(std::stod(r.at("t0_peak_ratio")), 0.6) << r.at("config");
      EXPECT_GT(std::stod(r.at("t0_mean_ratio")), 0.4) << r.at("config");
    }
    if (r.at("compress_ratio") != "0") {
      EXPECT_GT(std::stoull(r.at("compressed_bytes")), 0u);
    }
  }
  EXPECT_EQ(zero_by_beta.size(), 3u);
  EXPECT_TRUE(fs::exists(out_ / "summary.md"));

  // Resume: a second run with the same configuration adds nothing.
  const std::string before = ReadAll(out_ / "results.csv");
  ASSERT_TRUE(RunEval(options_).ok());
  EXPECT_EQ(ReadAll(out_ / "results.csv"), before);

  // A different configuration into the same directory: a clear error, nothing overwritten.
  EvalOptions other = options_;
  other.max_new_tokens = 50;
  other.min_new_tokens = 0;
  absl::Status s = RunEval(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("different configuration"), std::string::npos) << s;
  EXPECT_EQ(ReadAll(out_ / "results.csv"), before);

  // Unknown policy or codec: refused before anything runs.
  other = options_;
  other.configs = {"snapkv:hbm=0.5"};
  EXPECT_EQ(RunEval(other).code(), absl::StatusCode::kInvalidArgument);
  other.configs = {"hierarchy:compress=0.2,codec=int4"};
  EXPECT_EQ(RunEval(other).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAll(out_ / "results.csv"), before);
}

TEST_F(EvalQuick, MalformedQuestionFileNamesTheLine) {
  const fs::path bad = fs::temp_directory_path() / "kvtier_eval_bad.jsonl";
  std::ofstream(bad) << "{\"question\": \"ok?\"}\n{\"question\": 3}\n";
  options_.questions = bad.string();
  absl::Status s = RunEval(options_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(":2:"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(out_ / "results.csv"));
}

}  // namespace
}  // namespace kvtier::engine
