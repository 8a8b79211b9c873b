#include "bench/chaos/full_tmpfs.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace kvtier::testing {
namespace {

uint64_t Free(const std::string& dir) {
  struct statvfs st;
  return statvfs(dir.c_str(), &st) == 0 ? uint64_t{st.f_bavail} * st.f_frsize : 0;
}

// Whether a file of `bytes` can still be reserved in `dir` (what an extent needs).
bool Reserve(const std::string& dir, uint64_t bytes) {
  const int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0;
  close(fd);
  return ok;
}

TEST(FullTmpfsTest, FillLeavesNoRoomForAnExtentAndDrainGivesItBack) {
  const std::string dir = ::testing::TempDir() + "/kvtier-full-tmpfs-" + std::to_string(getpid());
  absl::StatusOr<std::unique_ptr<FullTmpfs>> tmpfs = FullTmpfs::Mount(dir, 8 << 20);
  if (!tmpfs.ok()) GTEST_SKIP() << "this host does not allow it: " << tmpfs.status();
  EXPECT_EQ(Free(dir), uint64_t{8} << 20);
  ASSERT_TRUE(Reserve(dir, 1 << 20));
  absl::StatusOr<uint64_t> left = (*tmpfs)->Fill();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0u);
  EXPECT_FALSE(Reserve(dir, 1 << 20)) << "an extent still fits in a full tmpfs";
  EXPECT_FALSE(Reserve(dir, 4096));
  (*tmpfs)->Drain();
  EXPECT_EQ(Free(dir), uint64_t{8} << 20);
  EXPECT_TRUE(Reserve(dir, 1 << 20));
}

TEST(FullTmpfsTest, FillTakesTheRoomAnExtentGaveBack) {
  const std::string dir = ::testing::TempDir() + "/kvtier-full-tmpfs-b" + std::to_string(getpid());
  absl::StatusOr<std::unique_ptr<FullTmpfs>> tmpfs = FullTmpfs::Mount(dir, 8 << 20);
  if (!tmpfs.ok()) GTEST_SKIP() << "this host does not allow it: " << tmpfs.status();
  // An extent holds 2 MiB while the tmpfs fills, then goes away.
  const int extent = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(extent, 0);
  ASSERT_EQ(fallocate(extent, 0, 0, 2 << 20), 0);
  ASSERT_TRUE((*tmpfs)->Fill().ok());
  close(extent);
  EXPECT_EQ(Free(dir), uint64_t{2} << 20);
  absl::StatusOr<uint64_t> left = (*tmpfs)->Fill();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0u);
  EXPECT_FALSE(Reserve(dir, 1 << 20));
}

}  // namespace
}  // namespace kvtier::testing
