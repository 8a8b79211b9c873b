#include "worker/cuda/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == EEXIST) return absl::AlreadyExistsError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

absl::StatusOr<uint8_t*> Map(int fd, uint64_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", name));
  return static_cast<uint8_t*>(p);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(const std::string& name,
                                                             uint64_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("name must be '/word', got '", name, "'"));
  }
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be > 0, got 0");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  // posix_fallocate, not ftruncate: on tmpfs a size past the free space must fail here, not
  // raise SIGBUS at the first touch of a missing page.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    if (err == ENOSPC) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no room for ", bytes, " bytes of shared memory for ", name));
    }
    return ErrnoStatus(err, absl::StrCat("posix_fallocate ", name, " to ", bytes));
  }
  absl::StatusOr<uint8_t*> data = Map(fd, bytes, name);
  close(fd);
  if (!data.ok()) {
    shm_unlink(name.c_str());
    return data.status();
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(name, *data, bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::CreateAnonymous(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes must be > 0, got 0");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap anonymous");
  return std::unique_ptr<ShmRegion>(
      new ShmRegion("", static_cast<uint8_t*>(p), bytes, /*owner=*/false));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err == 0 ? EINVAL : err, absl::StrCat("fstat ", name));
  }
  absl::StatusOr<uint8_t*> data = Map(fd, static_cast<uint64_t>(st.st_size), name);
  close(fd);
  if (!data.ok()) return data.status();
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(name, *data, static_cast<uint64_t>(st.st_size), /*owner=*/false));
}

ShmRegion::~ShmRegion() {
  munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

}  // namespace kvtier::worker::cuda
