#include "daemon/extent.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edge/cuda_vmm.h"

namespace kvtier::daemon {
namespace {

absl::Status Errno(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOSPC || err == ENOMEM || err == EFBIG || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(msg);
  }
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// A new open file description of the file behind `fd` (its /proc/self/fd link), read-write.
absl::StatusOr<edge::UniqueFd> Reopen(int fd) {
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const int again = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (again < 0) return Errno(absl::StrCat("reopen extent ", path), errno);
  return edge::UniqueFd(again);
}

absl::StatusOr<edge::UniqueFd> OpenUnnamed(const std::string& label, const std::string& dir) {
  int fd = dir.empty() ? memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING)
                       : open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Errno(dir.empty() ? std::string("memfd_create") : absl::StrCat("O_TMPFILE in ", dir),
                 errno);
  }
  return edge::UniqueFd(fd);
}

}  // namespace

absl::StatusOr<Extent> Extent::Create(const std::string& label, uint64_t bytes,
                                      const std::string& dir) {
  absl::StatusOr<edge::UniqueFd> fd = OpenUnnamed(label, dir);
  if (!fd.ok()) return fd.status();
  if (ftruncate(fd->get(), static_cast<off_t>(bytes)) != 0) {
    return Errno(absl::StrCat("size extent to ", bytes, " bytes"), errno);
  }
  int rc;
  do {
    rc = fallocate(fd->get(), 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    return Errno(absl::StrCat("reserve a ", bytes >> 20, " MiB extent",
                              dir.empty() ? "" : absl::StrCat(" in ", dir)),
                 errno);
  }
  if (dir.empty() &&
      fcntl(fd->get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("seal extent", errno);
  }
  if (dir.empty()) {
    // memfd_create's own file is not counted among the inode's writers (no open(2) path), which
    // would make OthersHold's lease probe off by one: keep a real open of it instead.
    absl::StatusOr<edge::UniqueFd> counted = Reopen(fd->get());
    if (!counted.ok()) return counted.status();
    fd = std::move(counted);
  }
  return Extent(*std::move(fd), bytes);
}

absl::StatusOr<Extent> Extent::Make(const std::string& label, uint64_t bytes,
                                    const ExtentSource& source) {
  if (source.memory == ExtentMemory::kMemfd) return Create(label, bytes, source.dir);
  if (source.cuda == nullptr) return absl::InternalError("CUDA VMM extent without a driver");
  absl::StatusOr<edge::UniqueFd> fd =
      edge::cuda::CreateExportedHostAllocation(*source.cuda, bytes, source.numa_node);
  if (!fd.ok()) return fd.status();
  return Extent(*std::move(fd), bytes, ExtentMemory::kCudaVmm);
}

absl::StatusOr<edge::UniqueFd> Extent::Share() const {
  if (memory_ == ExtentMemory::kMemfd) return Reopen(fd_.get());
  const int d = fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
  if (d < 0) return Errno("duplicate extent descriptor", errno);
  return edge::UniqueFd(d);
}

Extent::Holders Extent::OthersHold() const {
  if (memory_ != ExtentMemory::kMemfd) return Holders::kUnknown;
  if (fcntl(fd_.get(), F_SETLEASE, F_WRLCK) == 0) {
    (void)fcntl(fd_.get(), F_SETLEASE, F_UNLCK);
    return Holders::kNone;
  }
  return errno == EAGAIN || errno == EBUSY ? Holders::kSome : Holders::kUnknown;
}

absl::StatusOr<Extent> Extent::CreateSealedHeader(const std::string& label,
                                                  const layout::PoolHeader& header) {
  absl::StatusOr<edge::UniqueFd> fd = OpenUnnamed(label, "");
  if (!fd.ok()) return fd.status();
  if (ftruncate(fd->get(), static_cast<off_t>(layout::kPoolHeaderBytes)) != 0) {
    return Errno("size pool header", errno);
  }
  if (pwrite(fd->get(), &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return Errno("write pool header", errno);
  }
  if (fcntl(fd->get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return Errno("seal pool header", errno);
  }
  return Extent(*std::move(fd), layout::kPoolHeaderBytes);
}

}  // namespace kvtier::daemon
