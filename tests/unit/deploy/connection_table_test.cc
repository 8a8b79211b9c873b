#include "daemon/kvtierd/connection_table.h"

#include <sys/socket.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

TEST(ConnectionLimitsTest, RefusesAUidAtItsCapAndAdmitsAnotherUid) {
  ConnectionLimits limits({.total = 10, .per_uid = 2, .tcp = 1});
  EXPECT_TRUE(limits.Admit(1000).ok());
  EXPECT_TRUE(limits.Admit(1000).ok());
  const absl::Status refused = limits.Admit(1000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("server.max_connections_per_uid: uid 1000 has 2"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("limit is 2"), std::string::npos) << refused;
  EXPECT_TRUE(limits.Admit(1001).ok());
  limits.Release(1000);
  EXPECT_TRUE(limits.Admit(1000).ok());
  EXPECT_EQ(limits.open(), 3);
}

TEST(ConnectionLimitsTest, TcpPeersShareOneBudgetAndEveryoneTheTotal) {
  ConnectionLimits limits({.total = 3, .per_uid = 5, .tcp = 1});
  EXPECT_TRUE(limits.Admit(std::nullopt).ok());
  const absl::Status tcp = limits.Admit(std::nullopt);
  EXPECT_NE(tcp.message().find("server.max_tcp_connections"), std::string::npos) << tcp;
  EXPECT_TRUE(limits.Admit(0).ok());
  EXPECT_TRUE(limits.Admit(7).ok());
  const absl::Status total = limits.Admit(8);
  EXPECT_NE(total.message().find("server.max_connections: 3 connections open, the limit is 3"),
            std::string::npos)
      << total;
  limits.Release(std::nullopt);
  EXPECT_TRUE(limits.Admit(std::nullopt).ok());
}

TEST(ConnectionTableTest, CallsAreNotedPerConnectionAndClosedOnesArePruned) {
  int a[2], b[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  ConnectionTable table;
  const uint64_t first = table.Add(a[0], 1000, 0);
  const uint64_t second = table.Add(b[0], std::nullopt, 0);
  const absl::Time t = absl::Now();
  table.NoteCall("fd:" + std::to_string(a[0]), t);
  table.NoteCall("unix:/elsewhere", t);  // not one of ours: ignored
  std::vector<Connection> all = table.Snapshot();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, first);
  EXPECT_EQ(all[0].last_call, t);
  EXPECT_EQ(all[1].last_call, absl::InfinitePast());
  EXPECT_TRUE(table.Prune().empty());
  // The first closes and its number goes to a new socket: pruned, and the new one is not it.
  close(a[0]);
  int c[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
  ASSERT_EQ(dup2(c[0], a[0]), a[0]);
  const std::vector<Connection> gone = table.Prune();
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, first);
  EXPECT_EQ(gone[0].uid, std::optional<uid_t>(1000));
  all = table.Snapshot();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].id, second);
  for (int fd : {a[0], a[1], b[0], b[1], c[0], c[1]}) close(fd);
}

}  // namespace
}  // namespace kvtier::daemon
