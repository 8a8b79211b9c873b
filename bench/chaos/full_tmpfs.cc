#include "bench/chaos/full_tmpfs.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::testing {
namespace {

absl::Status Refused(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<uint64_t> FreeBytes(const std::string& dir) {
  struct statvfs st;
  if (statvfs(dir.c_str(), &st) != 0) return Refused("statvfs " + dir);
  return uint64_t{st.f_bavail} * st.f_frsize;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FullTmpfs>> FullTmpfs::Mount(const std::string& dir,
                                                            uint64_t bytes) {
  if (unshare(CLONE_NEWNS) != 0) {
    return Refused("a private mount namespace (unshare(CLONE_NEWNS), needs CAP_SYS_ADMIN)");
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Refused("making / private in the new mount namespace");
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Refused("mkdir " + dir);
  const std::string data = absl::StrCat("size=", bytes, ",mode=0700");
  if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) != 0) {
    return Refused(absl::StrCat("mount -t tmpfs -o ", data, " at ", dir));
  }
  return std::unique_ptr<FullTmpfs>(new FullTmpfs(dir));
}

FullTmpfs::~FullTmpfs() {
  Drain();
  umount2(dir_.c_str(), MNT_DETACH);
}

absl::StatusOr<uint64_t> FullTmpfs::Fill() {
  if (filler_ < 0) {
    filler_ = open((dir_ + "/filler").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (filler_ < 0) return Refused("open the filler in " + dir_);
  }
  absl::StatusOr<uint64_t> room = FreeBytes(dir_);
  if (!room.ok() || *room == 0) return room;
  struct stat st;
  if (fstat(filler_, &st) != 0) return Refused("fstat the filler");
  // ENOSPC: an extent took part of the room meanwhile; the next call takes the rest.
  if (fallocate(filler_, 0, st.st_size, static_cast<off_t>(*room)) != 0 && errno != ENOSPC) {
    return Refused("fallocate the filler");
  }
  return FreeBytes(dir_);
}

void FullTmpfs::Drain() {
  if (filler_ < 0) return;
  // Truncated first: a process forked meanwhile holds the descriptor too, and would keep the
  // blocks of an unlinked file.
  (void)!ftruncate(filler_, 0);
  close(filler_);
  filler_ = -1;
  unlink((dir_ + "/filler").c_str());
}

}  // namespace kvtier::testing
