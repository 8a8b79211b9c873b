#include "core/status/status_macros.h"

#include <memory>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok, int v) {
  if (!ok) return absl::InvalidArgumentError("no int");
  return std::make_unique<int>(v);
}

absl::StatusOr<int> Doubled(bool ok, int v) {
  ASSIGN_OR_RETURN(auto p, MakeInt(ok, v));
  return *p * 2;
}

absl::Status Chain(absl::Status first, int* reached) {
  RETURN_IF_ERROR(first);
  *reached = 1;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnMovesValueOnSuccess) {
  auto r = Doubled(true, 21);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesError) {
  auto r = Doubled(false, 21);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "no int");
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtFirstError) {
  int reached = 0;
  EXPECT_EQ(Chain(absl::NotFoundError("x"), &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(absl::OkStatus(), &reached).ok());
  EXPECT_EQ(reached, 1);
}

}  // namespace
}  // namespace kvtier
