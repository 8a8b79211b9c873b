#ifndef KVTIER_DAEMON_KVTIERD_CONNECTION_TABLE_H_
#define KVTIER_DAEMON_KVTIERD_CONNECTION_TABLE_H_

// The gRPC connections kvtierd accepted itself (daemon/kvtierd/grpc_acceptor.h) and handed to
// gRPC by descriptor: who is behind each (uid from SO_PEERCRED; TCP peers carry none), how many
// each uid holds, and when each last made a call. gRPC names such a connection "fd:N" in
// ServerContext::peer(), so a call is tied to its connection, never to a pid: a pid says nothing
// in another pid namespace (every peer there is pid 0) and one process can hold many
// connections.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}  // namespace grpc::experimental

namespace kvtier::daemon {

// How many connections may be open at once: in all, per uid of a unix peer, and over TCP
// (whose peers carry no uid, so they share one budget).
struct ConnectionCaps {
  int total = 1024;
  int per_uid = 128;
  int tcp = 64;
};

// Counts open connections against ConnectionCaps. Not thread-safe.
class ConnectionLimits {
 public:
  explicit ConnectionLimits(ConnectionCaps caps) : caps_(caps) {}
  // Takes a place for a peer with `uid` (none: a TCP peer), or RESOURCE_EXHAUSTED naming the
  // config key, the peer and the limit (nothing taken).
  absl::Status Admit(std::optional<uid_t> uid);
  // Gives back a place Admit took for the same `uid`.
  void Release(std::optional<uid_t> uid);
  int open() const { return open_; }
  const ConnectionCaps& caps() const { return caps_; }

 private:
  const ConnectionCaps caps_;
  int open_ = 0;
  int tcp_ = 0;
  std::map<uid_t, int> per_uid_;
};

// One accepted connection, as gRPC holds it.
struct Connection {
  uint64_t id = 0;  // never reused
  int fd = -1;      // gRPC's descriptor (closed by gRPC; the number may be reused)
  dev_t dev = 0;    // the socket's identity, to tell it from a later file on `fd`
  ino_t inode = 0;
  std::optional<uid_t> uid;                     // none: TCP
  pid_t pid = 0;                                // for the log only: 0 in another pid namespace
  absl::Time last_call = absl::InfinitePast();  // InfinitePast: none yet
};

// The open accepted connections. Thread-safe.
class ConnectionTable {
 public:
  // Records a connection gRPC now serves on `fd`; returns its id.
  uint64_t Add(int fd, std::optional<uid_t> uid, pid_t pid);
  // Notes a call on the connection gRPC names `peer` ("fd:N"); others are ignored.
  void NoteCall(const std::string& peer, absl::Time now);
  // Removes and returns the connections gRPC has closed (their descriptor is gone, or now
  // another file).
  std::vector<Connection> Prune();
  std::vector<Connection> Snapshot() const;
  // A gRPC interceptor that calls NoteCall for every call; `this` must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallRecorder();

 private:
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Connection> by_id_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> by_fd_ ABSL_GUARDED_BY(mu_);  // the latest connection on each fd
};

// Whether `fd` is still the file `dev`/`inode`.
bool SameFile(int fd, dev_t dev, ino_t inode);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CONNECTION_TABLE_H_
