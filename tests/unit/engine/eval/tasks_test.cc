// The task files, lengths and scoring of the retrieval evaluation (generation itself needs the
// model's tokenizer: tests/e2e/eval/task_eval_test.cc).

#include "engine/eval/tasks.h"

#include <filesystem>
#include <fstream>

#include "engine/eval/task_eval.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(Tasks, MatchesWholeWordsOnly) {
  EXPECT_TRUE(Matches(" 12345.", {"12345"}));
  EXPECT_FALSE(Matches("123456", {"12345"}));
  EXPECT_FALSE(Matches("a12345", {"12345"}));
  EXPECT_TRUE(Matches("They are: ABCDE, FGHIJ", {"abcde", "FGHIJ"}));
  EXPECT_FALSE(Matches("They are: ABCDE", {"ABCDE", "FGHIJ"}));
}

TEST(Tasks, ParsesNamesAndLengths) {
  EXPECT_EQ(ParseTaskNames("all")->size(), TaskNames().size());
  EXPECT_THAT(ParseTaskNames("passkey,nope").status().message(), HasSubstr("\"nope\""));
  EXPECT_EQ(*ParseLengths("1k, 2048"), (std::vector<uint32_t>{1024, 2048}));
  EXPECT_THAT(ParseLengths("1k,x").status().message(), HasSubstr("--lengths: \"x\""));
}

TEST(Tasks, JsonRoundTrips) {
  TaskQuestion q;
  q.question = "q?";
  q.answer_prefix = "A:";
  q.answers = {"1", "2"};
  TaskItem item{.id = "a-1", .task = "passkey", .length = 1024, .depth = 0.25, .context = "ctx"};
  item.questions = {q};
  item.max_new_tokens = 8;
  const fs::path p = fs::temp_directory_path() / ("tasks_rt_" + std::to_string(getpid()));
  std::ofstream(p) << TaskJson(item) << "\n";
  auto back = LoadTasks(p.string());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].context, "ctx");
  EXPECT_EQ((*back)[0].questions[0].answers, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ((*back)[0].questions[0].answer_prefix, "A:");
  fs::remove(p);
}

TEST(Tasks, MalformedFilesNameTheLineAndField) {
  const fs::path p = fs::temp_directory_path() / ("tasks_bad_" + std::to_string(getpid()));
  const std::string good =
      R"({"id":"x","task":"t","context":"c","max_new_tokens":4,"questions":[{"question":"q","answers":["a"]}]})";
  const std::pair<std::string, std::string> cases[] = {
      {"{", ":1: not a JSON object"},
      {R"({"task":"t","context":"c"})", "field \"id\""},
      {R"({"id":"x","task":"t","context":"c","questions":[]})", "field \"max_new_tokens\""},
      {R"({"id":"x","task":"t","context":"c","max_new_tokens":4,"questions":[]})",
       "field \"questions\""},
      {R"({"id":"x","task":"t","context":"c","max_new_tokens":4,"questions":[{"question":"q","answers":[]}]})",
       "questions[0].answers"},
      {good + "\n" + good, ":2: id \"x\" repeats"},
      {"", "holds no task"},
  };
  for (const auto& [text, want] : cases) {
    std::ofstream(p) << text << "\n";
    EXPECT_THAT(LoadTasks(p.string()).status().message(), HasSubstr(want)) << text;
  }
  EXPECT_EQ(LoadTasks("/nonexistent/tasks.jsonl").status().code(), absl::StatusCode::kNotFound);
  fs::remove(p);
}

TEST(Tasks, WilsonInterval) {
  const Wilson w = WilsonInterval(9, 10);
  EXPECT_NEAR(w.p, 0.9, 1e-12);
  EXPECT_NEAR(w.lo, 0.5958, 1e-3);  // the textbook value for 9/10
  EXPECT_NEAR(w.hi, 0.9821, 1e-3);
  EXPECT_EQ(WilsonInterval(0, 5).lo, 0.0);
  EXPECT_EQ(WilsonInterval(5, 5).hi, 1.0);
}

}  // namespace
}  // namespace kvtier::engine
