#ifndef KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_
#define KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_

// Drops gRPC connections whose peer stopped reading. gRPC 1.51 keeps every answer a peer has
// not read, and a peer that never acknowledges HTTP/2 SETTINGS is not even held to
// max_concurrent_streams: one client that sent requests and read nothing grew kvtierd by 1.5 GB
// in 8 s and starved every worker (tests/integration/stuck_client_test.cc). The guard watches
// the connections the daemon accepted on its gRPC unix socket; one whose unread bytes (SIOCOUTQ:
// sent by the daemon, not yet read by the peer) stayed above zero without ever going down for
// `timeout` is shut down, which makes gRPC close it and free its streams. A peer that reads at
// all restarts its clock.
//
// gRPC's client reads nothing while it has no call in flight, and kvtierd sends a few hundred
// bytes after the last answer, so an idle worker looks like a stuck one to the kernel. The
// kernel keeps no count of bytes received on a unix socket; the core knows instead when each
// session last called. A connection whose peer process holds a session and has made no call
// since its bytes went unread is paused, not stuck (it cannot be growing the daemon): it is kept,
// and its clock starts over. A worker SIGSTOPped keeps its connection while its lease lives and
// loses it once the lease is reaped.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/metrics.h"

namespace kvtier::daemon {

// The decision, without I/O: fed samples of (connection key, unread bytes), says which
// connections made no progress (unread 0, or less than at the last sample) for `timeout`. Not
// thread-safe.
class UnreadTracker {
 public:
  // Whether the peer behind connection `key` has sent nothing for `stuck_for` (the time since
  // the first sample that found its bytes unread and not going down).
  using Quiet = std::function<bool(uint64_t key, absl::Duration stuck_for)>;

  explicit UnreadTracker(absl::Duration timeout) : timeout_(timeout) {}
  // `samples` holds every watched connection at `now`; connections missing from it are
  // forgotten. Returns the keys to drop (each once: a dropped key starts over if seen again).
  // A connection due to be dropped is kept, its clock started over, when `quiet` (if given)
  // says its peer sent nothing since it got stuck.
  std::vector<uint64_t> Update(absl::Time now,
                               const std::vector<std::pair<uint64_t, uint64_t>>& samples,
                               const Quiet& quiet = nullptr);
  absl::Duration timeout() const { return timeout_; }

 private:
  struct Seen {
    uint64_t unread = 0;
    absl::Time progress;  // last sample with nothing unread or less than before
    absl::Time stuck_since = absl::InfiniteFuture();  // first sample after `progress`
  };
  const absl::Duration timeout_;
  std::map<uint64_t, Seen> seen_;
};

// Samples the accepted connections of the unix socket at `socket_path` every `period` on a
// thread it owns (started here, stopped and joined by the destructor) and shuts down those the
// tracker names; `since_last_call(pid)` is DaemonCore::SinceLastCall; `log` gets one line per
// connection dropped and `metrics` (may be null; must outlive this) counts it. Thread-safe.
class UnreadGuard {
 public:
  using SinceLastCall = std::function<std::optional<absl::Duration>(pid_t pid)>;

  UnreadGuard(std::string socket_path, absl::Duration timeout, absl::Duration period,
              SinceLastCall since_last_call, std::function<void(const std::string&)> log,
              Metrics* metrics = nullptr);
  ~UnreadGuard();
  UnreadGuard(const UnreadGuard&) = delete;
  UnreadGuard& operator=(const UnreadGuard&) = delete;

 private:
  void Loop();
  void Sweep();

  const std::string socket_path_;
  const absl::Duration period_;
  const SinceLastCall since_last_call_;
  const std::function<void(const std::string&)> log_;
  Metrics* const metrics_;
  UnreadTracker tracker_;  // the loop's only
  absl::Notification stop_;
  std::thread thread_;  // last: starts once everything above is ready
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_
