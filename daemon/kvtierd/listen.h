#ifndef KVTIER_DAEMON_KVTIERD_LISTEN_H_
#define KVTIER_DAEMON_KVTIERD_LISTEN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::daemon {

// Makes `path` ready for a new listener without ever taking over a live daemon's socket
// (gRPC unlinks an existing socket file before binding). FAILED_PRECONDITION when a process
// accepts connections there, or the directory is missing or not writable; a stale socket file
// (nobody listening) is removed.
absl::Status PrepareUnixSocketPath(const std::string& path);

// Removes shared-memory segments "<prefix>-ddr-*" and "<prefix>-cmp-*" left in `shm_dir` by a
// daemon that died without cleaning up (kill -9, OOM). Call only once no live daemon holds the
// socket. Workers that still map them keep their pages: an unlinked segment stays mapped.
// Returns the names removed.
std::vector<std::string> RemoveStaleSegments(const std::string& shm_prefix,
                                             const std::string& shm_dir = "/dev/shm");

// INVALID_ARGUMENT unless `address` ("host:port") names a loopback host.
absl::Status RequireLoopback(const std::string& address, const char* field);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_LISTEN_H_
