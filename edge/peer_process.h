#ifndef KVTIER_EDGE_PEER_PROCESS_H_
#define KVTIER_EDGE_PEER_PROCESS_H_

// The process on the other end of a unix socket, held by a pidfd: what the daemon watches to know
// when memory it handed out is really given back (a process that received extent descriptors may
// keep them mapped after its session ended), and what tells processes of one uid apart (root
// worker pods share uid 0). A pidfd names one process for its lifetime, across pid namespaces,
// and is never reused for another process the way a pid is.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "edge/memory_channel.h"

namespace kvtier::edge {

// One process, held by a pidfd. Immutable once made; thread-safe.
class PeerProcess {
 public:
  // The peer of a connected unix socket: SO_PEERPIDFD (Linux 6.5+, valid across pid namespaces),
  // else pidfd_open(pid) when the kernel gave a pid (`pid` != 0: the peer is in our pid
  // namespace; racy only if it exited and its pid was reused between connect and now).
  // UNAVAILABLE, saying why, when neither works.
  static absl::StatusOr<std::shared_ptr<const PeerProcess>> OfSocket(int socket_fd, pid_t pid);
  // Process `pid` of our pid namespace by pidfd_open (tests, and peers named without a socket).
  static absl::StatusOr<std::shared_ptr<const PeerProcess>> OfPid(pid_t pid);

  // A number equal for every pidfd of this process and never given to another one while this
  // system runs (the pidfs inode, Linux 6.9+); 0 when the kernel's pidfds cannot say (then
  // processes are told apart by nothing finer than their uid).
  uint64_t id() const { return id_; }
  // Whether the process has exited (its pidfd polls readable). Never blocks.
  bool Exited() const;
  // How the pidfd was obtained ("SO_PEERPIDFD" or "pidfd_open"), for logs.
  const char* how() const { return how_; }

 private:
  PeerProcess(UniqueFd pidfd, const char* how);
  UniqueFd pidfd_;
  uint64_t id_ = 0;
  const char* how_;
};

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_PEER_PROCESS_H_
