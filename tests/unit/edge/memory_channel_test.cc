#include "edge/memory_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace kvtier::edge {
namespace {

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds), 0);
    a.Reset(fds[0]);
    b.Reset(fds[1]);
  }
  UniqueFd a, b;
};

TEST(MemoryChannelTest, AMessageAndItsDescriptorsArriveTogether) {
  Pair p;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd r(pipe_fds[0]), w(pipe_fds[1]);
  v1::ChannelReply reply;
  reply.set_extent_count(2);
  reply.set_message("two descriptors");
  ASSERT_TRUE(SendMessage(p.a.get(), reply, {r.get(), w.get()}).ok());
  v1::ChannelReply got;
  auto fds = ReceiveMessage(p.b.get(), &got);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(got.message(), "two descriptors");
  ASSERT_EQ(fds->size(), 2u);
  // They are the same pipe: a byte written to the received write end comes out of ours.
  ASSERT_EQ(write((*fds)[1].get(), "z", 1), 1);
  char c = 0;
  ASSERT_EQ(read(r.get(), &c, 1), 1);
  EXPECT_EQ(c, 'z');
  EXPECT_NE(fcntl((*fds)[0].get(), F_GETFD) & FD_CLOEXEC, 0);  // received close-on-exec
}

TEST(MemoryChannelTest, AnEmptyMessageStillArrives) {
  Pair p;
  ASSERT_TRUE(SendMessage(p.a.get(), v1::ChannelReply(), {}).ok());
  v1::ChannelReply got;
  got.set_code(5);
  ASSERT_TRUE(ReceiveMessage(p.b.get(), &got).ok());
  EXPECT_EQ(got.code(), 0);
}

TEST(MemoryChannelTest, GarbageIsAClearErrorAndItsDescriptorsAreClosed) {
  Pair p;
  const char junk[] = "\xff\xff\xff\xff\xff";
  ASSERT_EQ(send(p.a.get(), junk, sizeof(junk), 0), static_cast<ssize_t>(sizeof(junk)));
  v1::ChannelRequest got;
  auto r = ReceiveMessage(p.b.get(), &got);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("ChannelRequest"), absl::string_view::npos) << r.status();
  p.a.Reset();
  EXPECT_EQ(ReceiveMessage(p.b.get(), &got).status().code(), absl::StatusCode::kUnavailable);
}

TEST(MemoryChannelTest, TooManyDescriptorsAreRefusedBeforeSending) {
  Pair p;
  std::vector<int> many(kMaxFdsPerMessage + 1, 0);
  EXPECT_EQ(SendMessage(p.a.get(), v1::ChannelReply(), many).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemoryChannelTest, ThePeerIsWhatTheKernelSays) {
  Pair p;
  auto peer = PeerOf(p.a.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  EXPECT_EQ(peer->pid, getpid());
}

TEST(MemoryChannelTest, ACallToAChannelNobodyServesIsUnavailableAndNamesThePath) {
  v1::ChannelRequest hello;
  hello.mutable_hello();
  auto r = ChannelCall("/nonexistent/kvtierd.sock.mem", hello, nullptr, absl::Milliseconds(100));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("/nonexistent/kvtierd.sock.mem"), absl::string_view::npos);
  EXPECT_EQ(UnixSocketPath("127.0.0.1:1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*UnixSocketPath("unix:/run/k.sock"), "/run/k.sock");
}

TEST(MemoryChannelTest, ListenGivesTheSocketItsModeAndRefusesToReplaceAFile) {
  const std::string dir = ::testing::TempDir() + "/chan-" + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/x.sock.mem";
  auto l = ListenChannel(path, 0660, static_cast<gid_t>(-1));
  ASSERT_TRUE(l.ok()) << l.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const std::string file = dir + "/plain";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  EXPECT_EQ(ListenChannel(file, 0660, static_cast<gid_t>(-1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  unlink(path.c_str());
  unlink(file.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace kvtier::edge
