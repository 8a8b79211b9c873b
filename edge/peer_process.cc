#include "edge/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

// glibc's headers may predate these (the kernel's values).
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace kvtier::edge {
namespace {

constexpr long kPidfsMagic = 0x50494446;  // PID_FS_MAGIC: pidfds are pidfs inodes (Linux 6.9+)

}  // namespace

PeerProcess::PeerProcess(UniqueFd pidfd, const char* how) : pidfd_(std::move(pidfd)), how_(how) {
  struct statfs fs {};
  struct stat st {};
  if (fstatfs(pidfd_.get(), &fs) == 0 && static_cast<long>(fs.f_type) == kPidfsMagic &&
      fstat(pidfd_.get(), &st) == 0) {
    id_ = static_cast<uint64_t>(st.st_ino);
  }
}

absl::StatusOr<std::shared_ptr<const PeerProcess>> PeerProcess::OfPid(pid_t pid) {
  if (pid <= 0) {
    return absl::UnavailableError(
        absl::StrCat("no pidfd for pid ", pid, ": the peer is in another pid namespace"));
  }
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("pidfd_open(", pid, "): ", std::strerror(errno)));
  }
  (void)fcntl(fd, F_SETFD, FD_CLOEXEC);  // pidfd_open sets it; be explicit for old kernels
  return std::shared_ptr<const PeerProcess>(new PeerProcess(UniqueFd(fd), "pidfd_open"));
}

absl::StatusOr<std::shared_ptr<const PeerProcess>> PeerProcess::OfSocket(int socket_fd, pid_t pid) {
  int fd = -1;
  socklen_t len = sizeof(fd);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
    return std::shared_ptr<const PeerProcess>(new PeerProcess(UniqueFd(fd), "SO_PEERPIDFD"));
  }
  const int err = errno;
  absl::StatusOr<std::shared_ptr<const PeerProcess>> by_pid = OfPid(pid);
  if (by_pid.ok()) return by_pid;
  return absl::UnavailableError(
      absl::StrCat("SO_PEERPIDFD: ", std::strerror(err), "; ", by_pid.status().message()));
}

bool PeerProcess::Exited() const {
  pollfd p{pidfd_.get(), POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace kvtier::edge
