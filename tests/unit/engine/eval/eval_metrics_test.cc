#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/eval/grid.h"
#include "engine/eval/metrics.h"
#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

TEST(KlDivergence, IsExactlyZeroForIdenticalLogitsAndPositiveOtherwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0, 3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> p(1000), q;
    for (float& x : p) x = n(rng);
    q = p;
    EXPECT_EQ(KlDivergence(p, q), 0.0);
    q[trial] += 1.f;
    EXPECT_GT(KlDivergence(p, q), 0.0);
  }
}

TEST(KlDivergence, MatchesTwoPointHandComputation) {
  // p = softmax(0, 0) = (.5, .5); q = softmax(0, log 3) = (.25, .75).
  const std::vector<float> p = {0.f, 0.f}, q = {0.f, std::log(3.f)};
  const double want = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  EXPECT_NEAR(KlDivergence(p, q), want, 1e-6);
}

TEST(Argmax, ArgmaxExceptSkipsBannedIds) {
  const std::vector<float> logits = {5.f, 1.f, 4.f, 3.f};
  EXPECT_EQ(Argmax(logits), 0);
  const int32_t banned[] = {0, 2};
  EXPECT_EQ(ArgmaxExcept(logits, banned), 3);
}

TEST(LastNumber, NormalisesSeparatorsSignsAndTrailingZeros) {
  EXPECT_EQ(LastNumber("so 3 apples and 1,234 pears."), "1234");
  EXPECT_EQ(LastNumber("total: $18.50"), "18.5");
  EXPECT_EQ(LastNumber("it is -3 degrees"), "-3");
  EXPECT_EQ(LastNumber("12.0"), "12");
  EXPECT_EQ(LastNumber("The answer is 42."), "42");
  EXPECT_EQ(LastNumber("no digits"), "");
  EXPECT_EQ(GoldAnswer("a\nb 7\n#### 1,000"), "1000");
  EXPECT_EQ(GoldAnswer("no marker 5"), "");
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(LoadQuestions, ReadsQuestionsAndSkipsBlankLines) {
  const std::string path =
      WriteTemp("kvtier_q_ok.jsonl",
                "{\"question\": \"a?\", \"answer\": \"#### 1\"}\n\n{\"question\": \"b?\"}\n");
  auto q = LoadQuestions(path);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->size(), 2u);
  EXPECT_EQ((*q)[1].line, 3u);
  EXPECT_EQ((*q)[1].answer, "");
}

TEST(LoadQuestions, NamesTheLineOfMalformedInput) {
  auto bad = LoadQuestions(WriteTemp("kvtier_q_bad.jsonl", "{\"question\": \"a?\"}\n{oops\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos) << bad.status();
  auto missing = LoadQuestions(WriteTemp("kvtier_q_missing.jsonl", "{\"q\": 1}\n"));
  EXPECT_NE(missing.status().message().find(":1:"), std::string::npos) << missing.status();
  auto empty = LoadQuestions(WriteTemp("kvtier_q_empty.jsonl", "\n"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadQuestions("/nonexistent/q.jsonl").status().code(), absl::StatusCode::kNotFound);
}

TEST(Grid, PaperGridHasEveryRowOfTheIssue) {
  auto grid = MakeGrid("paper");
  ASSERT_TRUE(grid.ok());
  int hierarchy = 0, baselines = 0, arkv = 0, t2 = 0;
  for (const EvalConfig& c : *grid) {
    EXPECT_TRUE(ValidateConfig(c).ok()) << c.Name();
    if (c.policy == "hierarchy" && c.compress_ratio == 0) ++hierarchy;
    if (c.policy == "hierarchy" && c.compress_ratio > 0) ++t2;
    if (c.policy == "h2o" || c.policy == "streaming" || c.policy == "rkv") ++baselines;
    if (c.policy == "arkv") ++arkv;
  }
  EXPECT_EQ(hierarchy, 18);
  EXPECT_EQ(baselines, 9);
  EXPECT_EQ(t2, 6);
  EXPECT_GE(arkv, 1);
  EXPECT_EQ(MakeGrid("huge").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Grid, RejectsUnknownPolicyCodecAndBadRatios) {
  EXPECT_TRUE(ParseConfig("hierarchy:hbm=0.3,evict=0.1").ok());
  EXPECT_EQ(ParseConfig("h2o:hbm=0.5")->hbm_ratio, 0.5);
  EXPECT_TRUE(ParseConfig("snapkv:hbm=0.5").ok());
  auto policy = ParseConfig("quest:hbm=0.5");
  EXPECT_NE(policy.status().message().find("quest"), std::string::npos);
  auto codec = ParseConfig("hierarchy:compress=0.2,codec=int4");
  EXPECT_NE(codec.status().message().find("int4"), std::string::npos);
  EXPECT_FALSE(ParseConfig("hierarchy:evict=1.5").ok());
  EXPECT_FALSE(ParseConfig("hierarchy:hbm=x").ok());
  EXPECT_FALSE(ParseConfig("hierarchy:evict=0.6,compress=0.6").ok());
  auto bounded = ParseConfig("hierarchy:evict=0.5,lost=0.02");
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(bounded->max_lost_mass, 0.02);
  EXPECT_EQ(bounded->Name(), "hierarchy b0.50 r0.50 g0.00 int8_kivi e0.020");
  EXPECT_EQ(ParseConfig("hierarchy:evict=0.5")->Name(), "hierarchy b0.50 r0.50 g0.00 int8_kivi");
  auto negative = ParseConfig("hierarchy:lost=-1");
  EXPECT_NE(negative.status().message().find("max_lost_mass"), std::string::npos);
}

TEST(Bootstrap, IntervalContainsTheMeanAndCollapsesForConstants) {
  const std::vector<double> same(30, 0.25);
  const Interval c = Bootstrap(same);
  EXPECT_EQ(c.lo, 0.25);
  EXPECT_EQ(c.hi, 0.25);
  std::vector<double> v;
  for (int i = 0; i < 50; ++i) v.push_back(i % 2);
  const Interval i = Bootstrap(v);
  EXPECT_NEAR(i.mean, 0.5, 1e-12);
  EXPECT_LT(i.lo, i.mean);
  EXPECT_GT(i.hi, i.mean);
  EXPECT_GT(i.lo, 0.3);
}

}  // namespace
}  // namespace kvtier::engine
