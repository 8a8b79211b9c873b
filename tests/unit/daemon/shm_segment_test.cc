#include "daemon/shm_segment.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

std::string UniqueName(const char* what) {
  std::random_device rd;
  return absl::StrCat("/kvtier-test-", what, "-", getpid(), "-", rd());
}

bool Exists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmSegmentTest, CreatesMapsFromSecondMappingAndRemovesOnDestruction) {
  const std::string name = UniqueName("pool");
  {
    ShmSegmentOptions o;
    o.name = name;
    o.kind = layout::PoolKind::kDdr;
    o.total_bytes = 1 << 20;
    o.daemon_epoch = 42;
    auto seg = ShmSegment::Create(o);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_TRUE(Exists(name));
    EXPECT_EQ(seg->size(), 1u << 20);
    EXPECT_EQ(seg->header().daemon_epoch, 42u);
    EXPECT_TRUE(
        layout::ValidatePoolHeader(seg->header(), layout::PoolKind::kDdr, seg->size()).ok());

    auto other = ShmSegment::Open(name, layout::PoolKind::kDdr);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_FALSE(other->owner());
    // Same memory through two mappings.
    std::memcpy(seg->data() + 100, "kvtier", 6);
    EXPECT_EQ(std::memcmp(other->data() + 100, "kvtier", 6), 0);
    EXPECT_NE(seg->base(), other->base());
    // Wrong kind is refused by the header check.
    auto wrong = ShmSegment::Open(name, layout::PoolKind::kCompressed);
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(wrong.status().message().find("kind"), std::string::npos);

    // The mode is applied regardless of the umask.
    struct stat st;
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fstat(fd, &st), 0);
    close(fd);
    EXPECT_EQ(st.st_mode & 0777, 0660u);

    // A mover takes the ownership; the moved-from object does nothing on destruction.
    ShmSegment moved = std::move(*seg);
    EXPECT_EQ(seg->base(), nullptr);
    EXPECT_TRUE(moved.owner());
  }
  EXPECT_FALSE(Exists(name));
}

TEST(ShmSegmentTest, CreateFailsWhenNameTaken) {
  const std::string name = UniqueName("dup");
  ShmSegmentOptions o;
  o.name = name;
  o.total_bytes = 65536;
  auto a = ShmSegment::Create(o);
  ASSERT_TRUE(a.ok());
  auto b = ShmSegment::Create(o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Exists(name));  // the failed create must not remove the first one
}

TEST(ShmSegmentTest, RejectsBadOptions) {
  ShmSegmentOptions o;
  o.name = "no-slash";
  o.total_bytes = 65536;
  EXPECT_EQ(ShmSegment::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.name = UniqueName("small");
  o.total_bytes = 100;
  EXPECT_EQ(ShmSegment::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.total_bytes = 65536;
  o.group = "kvtier-no-such-group-xyz";
  EXPECT_EQ(ShmSegment::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(o.name));
}

TEST(ShmSegmentTest, AppliesGroupAndMode) {
  struct group* grp = getgrgid(getgid());
  ASSERT_NE(grp, nullptr);
  ShmSegmentOptions o;
  o.name = UniqueName("group");
  o.total_bytes = 65536;
  o.group = grp->gr_name;
  o.mode = 0640;
  auto seg = ShmSegment::Create(o);
  ASSERT_TRUE(seg.ok()) << seg.status();
  struct stat st;
  int fd = shm_open(o.name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_EQ(st.st_gid, grp->gr_gid);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(ShmSegmentTest, OpenMissingIsNotFound) {
  EXPECT_EQ(ShmSegment::Open(UniqueName("missing"), layout::PoolKind::kDdr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ShmSegmentTest, OpenRejectsCorruptHeader) {
  const std::string name = UniqueName("corrupt");
  ShmSegmentOptions o;
  o.name = name;
  o.total_bytes = 65536;
  auto seg = ShmSegment::Create(o);
  ASSERT_TRUE(seg.ok());
  reinterpret_cast<layout::PoolHeader*>(seg->base())->abi_version = 99;
  auto opened = ShmSegment::Open(name, layout::PoolKind::kDdr);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("abi_version"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::daemon
