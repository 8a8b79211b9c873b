#include "daemon/kvtierd/listen.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

absl::Status PrepareUnixSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("server.socket \"", path, "\" must be 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes long"));
  }
  // A relative name ("k.sock") lives in the working directory.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("socket directory ", dir, " for ", path,
                                                      " is not usable: ", std::strerror(errno)));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // nothing there
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket(): ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another kvtierd is already serving on ", path,
                     "; stop it first or choose another socket (--socket)"));
  }
  if (err != ECONNREFUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot probe existing socket ", path, ": ", std::strerror(err)));
  }
  if (unlink(path.c_str()) != 0) {  // stale: its daemon is gone
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove stale socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RequireLoopback(const std::string& address, const char* field) {
  for (const char* prefix : {"127.", "localhost:", "[::1]:"}) {
    if (absl::StartsWith(address, prefix)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " \"", address, "\" must be a loopback address (127.0.0.1:PORT, [::1]:PORT)"));
}

}  // namespace kvtier::daemon
