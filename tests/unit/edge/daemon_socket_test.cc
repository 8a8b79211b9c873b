#include "edge/daemon_socket.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvtier::edge {
namespace {

// Sets (or, with nullptr, unsets) $KVTIER_SOCKET for one test and restores it after.
class ScopedSocketEnv {
 public:
  explicit ScopedSocketEnv(const char* value) {
    if (const char* old = getenv(kSocketEnv)) old_ = old;
    if (value) {
      setenv(kSocketEnv, value, 1);
    } else {
      unsetenv(kSocketEnv);
    }
  }
  ~ScopedSocketEnv() {
    if (old_) {
      setenv(kSocketEnv, old_->c_str(), 1);
    } else {
      unsetenv(kSocketEnv);
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(DaemonSocketTest, FlagThenEnvironmentThenFallback) {
  {
    ScopedSocketEnv env(nullptr);
    SocketChoice c = ChooseSocket(std::nullopt);
    EXPECT_EQ(c.path, "/run/kvtier/kvtierd.sock");
    EXPECT_EQ(c.origin, "the default");
    EXPECT_EQ(ChooseSocket(std::nullopt, "/srv/k.sock", "server.socket in k.toml").origin,
              "server.socket in k.toml");
  }
  {
    ScopedSocketEnv env("/tmp/env.sock");
    EXPECT_EQ(ChooseSocket(std::nullopt).path, "/tmp/env.sock");
    EXPECT_EQ(ChooseSocket(std::nullopt).origin, "KVTIER_SOCKET");
    EXPECT_EQ(ChooseSocket(std::nullopt, "/srv/k.sock").path, "/tmp/env.sock");
    SocketChoice flag = ChooseSocket(std::string("/tmp/flag.sock"));
    EXPECT_EQ(flag.path, "/tmp/flag.sock");
    EXPECT_EQ(flag.origin, "--socket");
  }
  {
    ScopedSocketEnv env("");  // set but empty: as if unset
    EXPECT_EQ(ChooseSocket(std::nullopt).origin, "the default");
  }
}

TEST(DaemonSocketTest, DescribeSaysWhereThePathCameFromAndHowToPickAnother) {
  EXPECT_EQ((SocketChoice{"/run/kvtier/kvtierd.sock", "the default"}).Describe(),
            "/run/kvtier/kvtierd.sock (the default; --socket or KVTIER_SOCKET picks another)");
  EXPECT_EQ((SocketChoice{"/x.sock", "KVTIER_SOCKET"}).Describe(),
            "/x.sock (KVTIER_SOCKET; --socket picks another)");
  EXPECT_EQ((SocketChoice{"/x.sock", "--socket"}).Describe(), "/x.sock (--socket)");
}

TEST(DaemonSocketTest, ProblemNamesAMissingSocketAFileAndIsEmptyForAListener) {
  char tmpl[] = "/tmp/daemon-socket-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string missing = dir + "/none.sock";
  EXPECT_TRUE(absl::StrContains(SocketProblem(missing), "no socket at " + missing));
  EXPECT_TRUE(absl::StrContains(SocketProblem(missing), "is kvtierd running"));
  const std::string file = dir + "/file.sock";
  std::ofstream(file) << "x";
  EXPECT_EQ(SocketProblem(file), file + " is not a socket");

  const std::string sock = dir + "/real.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  EXPECT_EQ(SocketProblem(sock), "");
  close(fd);
  unlink(sock.c_str());
  unlink(file.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace kvtier::edge
