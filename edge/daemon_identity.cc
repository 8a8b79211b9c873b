#include "edge/daemon_identity.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "edge/memory_channel.h"

namespace kvtier::edge {
namespace {

// The uid of user `name`; false when there is none.
bool UidOfUser(const std::string& name, uid_t* uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return false;
  }
  *uid = found->pw_uid;
  return true;
}

void Add(DaemonUids* d, uid_t uid) {
  if (!d->Contains(uid)) d->uids.push_back(uid);
}

std::string Mode(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

std::string FileType(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

std::string SealNames(int seals) {
  std::vector<std::string> names;
  if (seals & F_SEAL_SEAL) names.push_back("SEAL");
  if (seals & F_SEAL_SHRINK) names.push_back("SHRINK");
  if (seals & F_SEAL_GROW) names.push_back("GROW");
  if (seals & F_SEAL_WRITE) names.push_back("WRITE");
  return names.empty() ? "none" : absl::StrJoin(names, "|");
}

absl::Status Refused(const std::string& name, const std::string& expected,
                     const std::string& found) {
  return absl::UnauthenticatedError(absl::StrCat(name, ": expected ", expected, ", found ", found,
                                                 "; not mapped (not the daemon's memory?)"));
}

}  // namespace

bool DaemonUids::Contains(uid_t uid) const {
  return std::find(uids.begin(), uids.end(), uid) != uids.end();
}

std::string DaemonUids::Describe() const {
  std::string list;
  for (size_t i = 0; i < uids.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == uids.size() ? " or " : ", ", uids[i]);
  }
  return absl::StrCat("uid ", list, " (", source, ")");
}

absl::StatusOr<DaemonUids> ResolveDaemonUids(int64_t option_uid) {
  DaemonUids d;
  if (option_uid >= 0) {
    d.source = "ClientOptions.daemon_uid";
    Add(&d, static_cast<uid_t>(option_uid));
    Add(&d, 0);
    return d;
  }
  if (const char* env = std::getenv(kDaemonUidEnv); env != nullptr && *env != '\0') {
    d.source = kDaemonUidEnv;
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(env, &uid) && !UidOfUser(env, &uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kDaemonUidEnv, " = \"", env, "\" is neither a uid nor a user of this host"));
    }
    Add(&d, uid);
    Add(&d, 0);
    return d;
  }
  d.source = absl::StrCat("the default: root, this process's uid and user ", kDaemonUserName,
                          "'s; set ", kDaemonUidEnv, " or ClientOptions.daemon_uid");
  Add(&d, 0);
  Add(&d, geteuid());
  if (uid_t kvtier = 0; UidOfUser(kDaemonUserName, &kvtier)) Add(&d, kvtier);
  return d;
}

absl::Status CheckDaemonPeer(int fd, const std::string& path, const DaemonUids& daemon) {
  absl::StatusOr<PeerCredentials> peer = PeerOf(fd);
  if (!peer.ok()) return peer.status();
  if (daemon.Contains(peer->uid)) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(path, " is answered by uid ", peer->uid, " (pid ",
                                                 peer->pid, "), not the daemon's ",
                                                 daemon.Describe(), ": refusing to talk to it"));
}

absl::Status CheckDaemonSocketFile(const std::string& socket_path, const DaemonUids& daemon) {
  struct stat st;
  if (lstat(socket_path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::UnavailableError(absl::StrCat("no daemon socket at ", socket_path));
    }
    return absl::UnavailableError(absl::StrCat("stat ", socket_path, ": ", std::strerror(err)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnauthenticatedError(
        absl::StrCat(socket_path, " is ", FileType(st.st_mode), ", not the daemon's socket"));
  }
  if (!daemon.Contains(st.st_uid)) {
    return absl::UnauthenticatedError(absl::StrCat(socket_path, " was bound by uid ", st.st_uid,
                                                   ", not the daemon's ", daemon.Describe(),
                                                   ": refusing to talk to it"));
  }
  const size_t slash = socket_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : socket_path.substr(0, slash);
  if (stat(dir.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("stat ", dir, ": ", std::strerror(errno)));
  }
  if (!daemon.Contains(st.st_uid) || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the daemon's socket directory ", dir, " is owned by uid ", st.st_uid, " with mode ",
        Mode(st.st_mode), ": whoever else may write it can replace the daemon's socket; expected ",
        "an owner among ", daemon.Describe(), " and no group or other write permission"));
  }
  return absl::OkStatus();
}

absl::Status CheckExtentDescriptor(int fd, const std::string& name, DescriptorKind kind,
                                   uint64_t bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return Refused(name, "an open descriptor", absl::StrCat("fstat: ", std::strerror(errno)));
  }
  if (kind == DescriptorKind::kCudaVmm) {
    // A CUDA shareable handle's descriptor is the driver's; what it cannot be is checked here, and
    // cuMemMap refuses an allocation smaller than the extent.
    if (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISDIR(st.st_mode)) {
      return Refused(name, "a CUDA VMM handle", FileType(st.st_mode));
    }
    if (S_ISREG(st.st_mode) && st.st_size != 0 && static_cast<uint64_t>(st.st_size) != bytes) {
      return Refused(name, absl::StrCat(bytes, " bytes"), absl::StrCat(st.st_size, " bytes"));
    }
    return absl::OkStatus();
  }
  if (!S_ISREG(st.st_mode)) return Refused(name, "a memfd", FileType(st.st_mode));
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return Refused(name, absl::StrCat(bytes, " bytes"), absl::StrCat(st.st_size, " bytes"));
  }
  int want = F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;
  if (kind == DescriptorKind::kSealedHeader) want |= F_SEAL_WRITE;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & want) != want) {
    return Refused(name, absl::StrCat("seals ", SealNames(want)),
                   seals < 0 ? absl::StrCat("no seals (", std::strerror(errno), ")")
                             : absl::StrCat("seals ", SealNames(seals)));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::edge
