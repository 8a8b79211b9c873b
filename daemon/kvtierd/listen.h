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

// INVALID_ARGUMENT unless `address` ("host:port") names a loopback host.
absl::Status RequireLoopback(const std::string& address, const char* field);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_LISTEN_H_
