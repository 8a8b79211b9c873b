#ifndef KVTIER_DAEMON_KVTIERD_GRPC_ACCEPTOR_H_
#define KVTIER_DAEMON_KVTIERD_GRPC_ACCEPTOR_H_

// kvtierd accepts its gRPC connections itself and hands each to gRPC by descriptor
// (grpc::AddInsecureChannelFromFd), instead of letting gRPC listen:
// - every connection is counted against ConnectionCaps (per uid from SO_PEERCRED, TCP peers
//   apart, and in all below RLIMIT_NOFILE); one over a cap is refused with an HTTP/2 GOAWAY
//   whose text names the limit, and closed;
// - at the descriptor limit (EMFILE, ENFILE) it backs off instead of spinning, and keeps a
//   reserve descriptor to accept and close the connection that waits, so the peer learns at
//   once; it accepts again as soon as descriptors are free (gRPC 1.51's own listener stops for
//   good after one EMFILE);
// - the connections it accepted are listed in a ConnectionTable for the unread guard.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/kvtierd/connection_table.h"
#include "daemon/metrics.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// A listening unix stream socket at `path` (which PrepareUnixSocketPath made ready).
absl::StatusOr<edge::UniqueFd> ListenUnix(const std::string& path);
// A listening TCP socket on `address` ("127.0.0.1:PORT", "localhost:PORT", "[::1]:PORT"; port
// 0 picks one); `port` gets the port bound. Never SO_REUSEPORT: a second daemon must fail.
// `field` (the config key) names the address in errors.
absl::StatusOr<edge::UniqueFd> ListenTcp(const std::string& address, int* port,
                                         const char* field = "server.tcp");

// The most connections the descriptor limit allows: half of RLIMIT_NOFILE, the rest left to
// extents, pools and the memory channel.
int DescriptorCap();

// Accepts on the listeners on a thread it owns (started here, stopped and joined by the
// destructor, which also closes the listeners) and passes each admitted connection to
// `serve(fd)`, which takes ownership. Thread-safe.
class GrpcAcceptor {
 public:
  struct Listener {
    edge::UniqueFd fd;
    bool tcp = false;
  };
  GrpcAcceptor(std::vector<Listener> listeners, ConnectionCaps caps, ConnectionTable* table,
               std::function<void(int fd)> serve, std::function<void(const std::string&)> log,
               Metrics* metrics = nullptr);
  ~GrpcAcceptor();
  GrpcAcceptor(const GrpcAcceptor&) = delete;
  GrpcAcceptor& operator=(const GrpcAcceptor&) = delete;

 private:
  void Loop();
  // Accepts what waits on `l`; false when out of descriptors (the caller backs off).
  bool AcceptAll(const Listener& l);
  void Admit(edge::UniqueFd fd, bool tcp);
  void ReleaseClosed();
  void Refuse(int fd, const std::string& why);

  std::vector<Listener> listeners_;
  ConnectionTable* const table_;
  const std::function<void(int)> serve_;
  const std::function<void(const std::string&)> log_;
  Metrics* const metrics_;
  edge::UniqueFd wake_;     // eventfd: the destructor's stop
  edge::UniqueFd reserve_;  // given up at EMFILE to accept and close one waiting peer
  // The loop's only:
  ConnectionLimits limits_;
  bool starved_ = false;  // out of descriptors since the last accept
  absl::Duration backoff_;
  absl::Time last_refusal_log_ = absl::InfinitePast();
  uint64_t refused_since_log_ = 0;
  std::thread thread_;  // last: starts once everything above is ready
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_GRPC_ACCEPTOR_H_
