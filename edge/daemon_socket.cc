#include "edge/daemon_socket.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::edge {
namespace {

std::string GroupName(gid_t gid) {
  const group* g = getgrgid(gid);
  return g != nullptr ? g->gr_name : absl::StrCat(gid);
}

}  // namespace

std::string SocketChoice::Describe() const {
  if (origin == "--socket") return absl::StrCat(path, " (--socket)");
  return absl::StrCat(path, " (", origin, "; ",
                      origin == kSocketEnv ? "--socket" : absl::StrCat("--socket or ", kSocketEnv),
                      " picks another)");
}

SocketChoice ChooseSocket(const std::optional<std::string>& flag, const std::string& fallback,
                          const std::string& fallback_origin) {
  if (flag) return {*flag, "--socket"};
  const char* env = std::getenv(kSocketEnv);
  if (env != nullptr && *env != '\0') return {env, kSocketEnv};
  return {fallback, fallback_origin};
}

std::string SocketProblem(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (err == EACCES) {
      struct stat dir_st;
      const std::string group =
          stat(dir.c_str(), &dir_st) == 0 ? GroupName(dir_st.st_gid) : std::string("kvtier");
      return absl::StrCat("permission denied on ", dir, ": join its group (usermod -aG ", group,
                          " $USER, then log in again)");
    }
    if (err == ENOENT) {
      return absl::StrCat("no socket at ", path,
                          ": is kvtierd running? (systemctl status kvtierd, or start one with "
                          "kvtierd --socket ",
                          path, ")");
    }
    return absl::StrCat("cannot stat ", path, ": ", std::strerror(err));
  }
  if (!S_ISSOCK(st.st_mode)) return absl::StrCat(path, " is not a socket");
  if (access(path.c_str(), R_OK | W_OK) != 0) {
    return absl::StrCat(
        "permission denied on ", path, " (mode ", absl::StrFormat("%04o", st.st_mode & 0777),
        "): join its group (usermod -aG ", GroupName(st.st_gid), " $USER, then log in again)");
  }
  return "";
}

}  // namespace kvtier::edge
