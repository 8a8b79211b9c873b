#include "edge/daemon_identity.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"

namespace kvtier::edge {
namespace {

bool Has(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

UniqueFd Memfd(uint64_t bytes, int seals) {
  UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

constexpr int kExtentSeals = F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;

TEST(DaemonIdentityTest, AnExplicitUidIsTakenWithRootOnly) {
  auto d = ResolveDaemonUids(4242);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->Contains(4242));
  EXPECT_TRUE(d->Contains(0));
  EXPECT_EQ(d->uids.size(), 2u);
  EXPECT_EQ(d->Describe(), "uid 4242 or 0 (ClientOptions.daemon_uid)");
}

TEST(DaemonIdentityTest, TheEnvironmentNamesAUidOrAUserAndAnythingElseIsAClearError) {
  setenv(kDaemonUidEnv, "777", 1);
  auto number = ResolveDaemonUids(-1);
  ASSERT_TRUE(number.ok());
  EXPECT_TRUE(number->Contains(777));
  EXPECT_EQ(number->source, kDaemonUidEnv);
  setenv(kDaemonUidEnv, "root", 1);
  auto name = ResolveDaemonUids(-1);
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->uids, std::vector<uid_t>{0});
  setenv(kDaemonUidEnv, "no-such-user-kvtier", 1);
  auto bad = ResolveDaemonUids(-1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(bad.status(), "KVTIER_DAEMON_UID = \"no-such-user-kvtier\"")) << bad.status();
  unsetenv(kDaemonUidEnv);
}

TEST(DaemonIdentityTest, TheDefaultIsRootAndThisProcesssUid) {
  unsetenv(kDaemonUidEnv);
  auto d = ResolveDaemonUids(-1);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->Contains(0));
  EXPECT_TRUE(d->Contains(geteuid()));
  EXPECT_NE(d->source.find(kDaemonUidEnv), std::string::npos) << d->source;
}

TEST(DaemonIdentityTest, APeerOfAnotherUidIsRefusedNamingTheUidFoundAndExpected) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd a(pair[0]), b(pair[1]);
  const uid_t other = geteuid() + 1;
  DaemonUids expected{{other}, "test"};
  absl::Status s = CheckDaemonPeer(a.get(), "/run/x.mem", expected);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, absl::StrCat("/run/x.mem is answered by uid ", geteuid(), " (pid ", getpid(),
                                  "), not the daemon's uid ", other, " (test)")))
      << s;
  EXPECT_TRUE(CheckDaemonPeer(a.get(), "/run/x.mem", DaemonUids{{geteuid()}, "test"}).ok());
}

class SocketFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-identity-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/kvtierd.sock";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  void Bind() {
    auto l = ListenChannel(path_, 0660, static_cast<gid_t>(-1));
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = *std::move(l);
  }
  std::string dir_, path_;
  UniqueFd listener_;
  DaemonUids mine_{{geteuid()}, "test"};
};

TEST_F(SocketFileTest, NoSocketYetIsUnavailableAsNoDaemon) {
  EXPECT_EQ(CheckDaemonSocketFile(path_, mine_).code(), absl::StatusCode::kUnavailable);
}

TEST_F(SocketFileTest, TheDaemonsSocketInASafeDirectoryIsTaken) {
  ASSERT_NO_FATAL_FAILURE(Bind());
  EXPECT_TRUE(CheckDaemonSocketFile(path_, mine_).ok());
}

TEST_F(SocketFileTest, ASocketBoundByAnotherUidIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Bind());
  absl::Status s = CheckDaemonSocketFile(path_, DaemonUids{{geteuid() + 1}, "test"});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, absl::StrCat(path_, " was bound by uid ", geteuid()))) << s;
}

TEST_F(SocketFileTest, ADirectoryOthersMayWriteIsRefusedNamingItsMode) {
  ASSERT_NO_FATAL_FAILURE(Bind());
  ASSERT_EQ(chmod(dir_.c_str(), 01777), 0);
  absl::Status s = CheckDaemonSocketFile(path_, mine_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, absl::StrCat("socket directory ", dir_, " is owned by uid ", geteuid(),
                                  " with mode 1777")))
      << s;
  ASSERT_EQ(chmod(dir_.c_str(), 0770), 0);
  EXPECT_EQ(CheckDaemonSocketFile(path_, mine_).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(SocketFileTest, ARegularFileAtTheSocketsPathIsRefused) {
  UniqueFd f(open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(f.valid());
  absl::Status s = CheckDaemonSocketFile(path_, mine_);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, "is a regular file, not the daemon's socket")) << s;
}

TEST(ExtentDescriptorTest, TheDaemonsSealedMemfdOfTheAnnouncedSizeIsTaken) {
  UniqueFd fd = Memfd(1 << 20, kExtentSeals);
  EXPECT_TRUE(
      CheckExtentDescriptor(fd.get(), "DDR pool extent 0", DescriptorKind::kMemfd, 1 << 20).ok());
}

TEST(ExtentDescriptorTest, AWrongSizeIsRefusedNamingTheDescriptorExpectedAndFound) {
  UniqueFd fd = Memfd(2 << 20, kExtentSeals);
  absl::Status s =
      CheckExtentDescriptor(fd.get(), "DDR pool extent 3", DescriptorKind::kMemfd, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, "DDR pool extent 3: expected 1048576 bytes, found 2097152 bytes")) << s;
}

TEST(ExtentDescriptorTest, AnUnsealedOrHalfSealedMemfdIsRefusedNamingTheSeals) {
  UniqueFd none = Memfd(4096, 0);
  absl::Status s = CheckExtentDescriptor(none.get(), "e", DescriptorKind::kMemfd, 4096);
  EXPECT_TRUE(Has(s, "e: expected seals SEAL|SHRINK|GROW, found seals none")) << s;
  UniqueFd half = Memfd(4096, F_SEAL_SHRINK | F_SEAL_SEAL);
  s = CheckExtentDescriptor(half.get(), "e", DescriptorKind::kMemfd, 4096);
  EXPECT_TRUE(Has(s, "found seals SEAL|SHRINK")) << s;
  // A header must be sealed against writes as well.
  UniqueFd header = Memfd(4096, kExtentSeals);
  s = CheckExtentDescriptor(header.get(), "h", DescriptorKind::kSealedHeader, 4096);
  EXPECT_TRUE(Has(s, "h: expected seals SEAL|SHRINK|GROW|WRITE")) << s;
}

TEST(ExtentDescriptorTest, AFileThatCannotBeSealedOrAPipeIsRefused) {
  char tmpl[] = "/tmp/kvtier-extent-XXXXXX";
  UniqueFd file(mkstemp(tmpl));
  unlink(tmpl);
  ASSERT_EQ(ftruncate(file.get(), 4096), 0);
  absl::Status s = CheckExtentDescriptor(file.get(), "e", DescriptorKind::kMemfd, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(s, "e: expected seals SEAL|SHRINK|GROW, found")) << s;
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  s = CheckExtentDescriptor(r.get(), "e", DescriptorKind::kMemfd, 4096);
  EXPECT_TRUE(Has(s, "e: expected a memfd, found a pipe")) << s;
  s = CheckExtentDescriptor(r.get(), "v", DescriptorKind::kCudaVmm, 4096);
  EXPECT_TRUE(Has(s, "v: expected a CUDA VMM handle, found a pipe")) << s;
}

TEST(ExtentDescriptorTest, ACudaVmmHandleThatIsAFileMustHaveTheExtentsSize) {
  UniqueFd fd = Memfd(8192, 0);
  EXPECT_TRUE(CheckExtentDescriptor(fd.get(), "v", DescriptorKind::kCudaVmm, 8192).ok());
  absl::Status s = CheckExtentDescriptor(fd.get(), "v", DescriptorKind::kCudaVmm, 4096);
  EXPECT_TRUE(Has(s, "v: expected 4096 bytes, found 8192 bytes")) << s;
}

}  // namespace
}  // namespace kvtier::edge
