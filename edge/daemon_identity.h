#ifndef KVTIER_EDGE_DAEMON_IDENTITY_H_
#define KVTIER_EDGE_DAEMON_IDENTITY_H_

// How a client knows it talks to the real kvtierd (docs/security.md, "Who answers"): the kernel
// names the uid on the other end of every memory-channel connection (SO_PEERCRED), and the gRPC
// socket file was bound by its owner in a directory nobody else may write; both must be a uid
// the client expects. What the daemon hands over is checked too: every extent descriptor's type,
// size and seals, before anything of it is mapped.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::edge {

// The environment variable that names the daemon's uid (a number or a user name) when
// ClientOptions.daemon_uid does not.
inline constexpr char kDaemonUidEnv[] = "KVTIER_DAEMON_UID";
// The system user deploy/install.sh creates for kvtierd.
inline constexpr char kDaemonUserName[] = "kvtier";

// The uids that may answer as the daemon, and where that list came from (for error messages).
// Root is always among them: it can read any process's memory anyway.
struct DaemonUids {
  std::vector<uid_t> uids;
  std::string source;

  bool Contains(uid_t uid) const;
  // "0, 1000 or 998 (ClientOptions.daemon_uid)" for error messages.
  std::string Describe() const;
};

// `option_uid` >= 0: that uid and root. Otherwise $KVTIER_DAEMON_UID (a uid or a user name) and
// root. Otherwise the default: root, this process's effective uid (whose processes can read its
// memory anyway) and the `kvtier` system user's uid where that user exists. INVALID_ARGUMENT
// naming the variable and its value when the environment names no uid or user.
absl::StatusOr<DaemonUids> ResolveDaemonUids(int64_t option_uid);

// The peer of the connected unix socket `fd` (which answers at `path`) is one of `daemon`:
// UNAUTHENTICATED naming the path, the uid (and pid) found and the uids expected otherwise.
absl::Status CheckDaemonPeer(int fd, const std::string& path, const DaemonUids& daemon);

// The gRPC unix socket at `socket_path` was bound by one of `daemon` (a socket file's owner is
// the uid that bound it) in a directory owned by one of them and writable by nobody else, so that
// nobody else can put a socket of their own there later. UNAVAILABLE when there is no socket yet
// (no daemon there); UNAUTHENTICATED naming the file, what was found and what was expected.
absl::Status CheckDaemonSocketFile(const std::string& socket_path, const DaemonUids& daemon);

// What an extent descriptor must be before it is mapped.
enum class DescriptorKind {
  kMemfd,         // a memfd sealed against growing, shrinking and new seals
  kSealedHeader,  // a memfd sealed as above and against writes
  kCudaVmm,       // a CUDA VMM shareable handle: no socket, pipe or directory; a file's size
};

// Checks `fd` (called `name` in errors, e.g. "DDR pool extent 3") against `kind` and `bytes`:
// fstat's type, the size the daemon announced, and the seals (F_GET_SEALS).
// UNAUTHENTICATED naming the descriptor, what was expected and what was found otherwise.
absl::Status CheckExtentDescriptor(int fd, const std::string& name, DescriptorKind kind,
                                   uint64_t bytes);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_DAEMON_IDENTITY_H_
