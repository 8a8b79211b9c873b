#include "bench/chaos/chaos_options.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<ChaosOptions> Parse(const std::vector<std::string>& args) {
  return ParseChaosOptions(args);
}

std::string Error(const std::vector<std::string>& args) {
  absl::StatusOr<ChaosOptions> o = Parse(args);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << o.status();
  return std::string(o.status().message());
}

TEST(ChaosOptionsTest, EveryFaultCountAndDurationIsReadInAnyOrder) {
  absl::StatusOr<ChaosOptions> o =
      Parse({"--full-ms",    "900",  "--stuck-clients", "3",   "--workers",           "8",
             "--full-tmpfs", "2",    "--kills",         "100", "--unread-timeout-ms", "700",
             "--ttl-ms",     "1500", "--reloads",       "4",   "--lease-stalls",      "2",
             "--stalls",     "5",    "--restarts",      "0"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->workers, 8);
  EXPECT_EQ(o->kills, 100);
  EXPECT_EQ(o->stalls, 5);
  EXPECT_EQ(o->restarts, 0);
  EXPECT_EQ(o->reloads, 4);
  EXPECT_EQ(o->lease_stalls, 2);
  EXPECT_EQ(o->stuck_clients, 3);
  EXPECT_EQ(o->full_tmpfs, 2);
  EXPECT_EQ(o->full_ms, 900);
  EXPECT_EQ(o->unread_timeout_ms, 700);
  EXPECT_EQ(o->ttl_ms, 1500);
  EXPECT_FALSE(o->soak);
}

TEST(ChaosOptionsTest, NoArgumentsInjectNeitherNewFault) {
  absl::StatusOr<ChaosOptions> o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stuck_clients, 0);
  EXPECT_EQ(o->full_tmpfs, 0);
  EXPECT_TRUE(o->help.empty());
}

TEST(ChaosOptionsTest, ACountOutOfRangeNamesTheOptionAndTheValue) {
  EXPECT_THAT(Error({"--stuck-clients", "1001"}),
              AllOf(HasSubstr("--stuck-clients"), HasSubstr("1001")));
  EXPECT_THAT(Error({"--full-tmpfs", "-1"}), AllOf(HasSubstr("--full-tmpfs"), HasSubstr("-1")));
  EXPECT_THAT(Error({"--workers", "0"}), AllOf(HasSubstr("--workers"), HasSubstr("0")));
  EXPECT_THAT(Error({"--kills", "many"}), AllOf(HasSubstr("--kills"), HasSubstr("many")));
}

TEST(ChaosOptionsTest, ADurationOutOfRangeNamesTheOptionAndTheValue) {
  EXPECT_THAT(Error({"--ttl-ms", "100"}), AllOf(HasSubstr("--ttl-ms"), HasSubstr("100")));
  EXPECT_THAT(Error({"--stuck-clients", "1", "--unread-timeout-ms", "50"}),
              AllOf(HasSubstr("--unread-timeout-ms"), HasSubstr("50")));
  EXPECT_THAT(Error({"--full-tmpfs", "1", "--full-ms", "60001"}),
              AllOf(HasSubstr("--full-ms"), HasSubstr("60001")));
}

TEST(ChaosOptionsTest, AnUnknownOptionOrAMissingValueIsRefused) {
  EXPECT_THAT(Error({"--stuck-client", "2"}), HasSubstr("--stuck-client"));
  EXPECT_THAT(Error({"--full-tmpfs"}), HasSubstr("--full-tmpfs"));
}

TEST(ChaosOptionsTest, ASettingOfAFaultNotInjectedIsRefused) {
  EXPECT_THAT(Error({"--full-ms", "900"}),
              AllOf(HasSubstr("--full-ms 900"), HasSubstr("--full-tmpfs")));
  EXPECT_THAT(Error({"--unread-timeout-ms", "700"}),
              AllOf(HasSubstr("--unread-timeout-ms 700"), HasSubstr("--stuck-clients")));
}

TEST(ChaosOptionsTest, ASoakTakesNoFaultAndNamesTheOnesGiven) {
  EXPECT_THAT(Error({"--soak", "60", "--stuck-clients", "1", "--full-tmpfs", "1"}),
              AllOf(HasSubstr("--soak 60"), HasSubstr("--stuck-clients, --full-tmpfs")));
  EXPECT_THAT(Error({"--sequences", "4"}), HasSubstr("--sequences need --soak"));
  absl::StatusOr<ChaosOptions> o = Parse({"--soak", "60", "--sequences", "4"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->soak);
  EXPECT_EQ(o->soak_options.seconds, 60);
  EXPECT_EQ(o->soak_options.sequences, 4);
  EXPECT_EQ(o->soak_options.workers, 32);  // the soak's own default, not the faults'
}

TEST(ChaosOptionsTest, TheSeedReachesTheFaultsAndTheSoak) {
  absl::StatusOr<ChaosOptions> o = Parse({"--seed", "42", "--kills", "3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->seed, 42u);
  o = Parse({"--soak", "60", "--seed", "7"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->soak_options.seed, 7u);
  EXPECT_NE(Parse({}).value().seed, 42u);  // a default, not the last value parsed
  EXPECT_THAT(Error({"--seed", "-3"}), AllOf(HasSubstr("--seed"), HasSubstr("-3")));
}

TEST(ChaosOptionsTest, HelpListsTheNewFaults) {
  absl::StatusOr<ChaosOptions> o = Parse({"--help"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->help, AllOf(HasSubstr("--stuck-clients"), HasSubstr("--full-tmpfs")));
}

}  // namespace
}  // namespace kvtier::testing
