#ifndef KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_
#define KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_

// Drops gRPC connections whose peer stopped reading. gRPC 1.51 keeps every answer a peer has
// not read, and a peer that never acknowledges HTTP/2 SETTINGS is not even held to
// max_concurrent_streams: one client that sent requests and read nothing grew kvtierd by 1.5 GB
// in 8 s and starved every worker (tests/integration/stuck_client_test.cc). The guard watches
// the connections kvtierd accepted (ConnectionTable: unix and TCP); one whose unread bytes
// (SIOCOUTQ: sent by the daemon, not yet read or acknowledged by the peer) stayed above zero
// without the peer reading anything for `timeout` is shut down, which makes gRPC close it and
// free its streams.
//
// "Reading anything" is what the kernel sees, not the unread count falling: a worker that reads
// every answer can leave the same count unread at every sample (the bytes kvtierd sent after its
// last answer), and was dropped for it. On a unix socket each skb the peer consumes wakes the
// sender's write space, which the guard counts with an edge-triggered epoll of its own. A TCP
// peer is on this host (server.tcp is loopback only): its own socket, found through
// NETLINK_SOCK_DIAG, says what its process left unread and has read.
//
// gRPC's client reads nothing while it has no call in flight, so an idle worker looks like a
// stuck one to the kernel. A connection that made a call and none since its bytes went unread is
// paused, not stuck (it cannot be growing the daemon): it is kept, and its clock starts over.
// Calls are counted per connection (ConnectionTable::NoteCall), never per pid: a flooder on its
// own connection is dropped whatever sessions its process holds, and a pid namespace's pid 0 is
// no identity.

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
#include "daemon/kvtierd/connection_table.h"
#include "daemon/metrics.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// One connection at one instant.
struct UnreadSample {
  uint64_t key = 0;
  uint64_t unread = 0;  // bytes sent, not yet read by the peer's process
  uint64_t reads = 0;   // a counter that moves whenever the peer reads anything
};

// The decision, without I/O: fed samples, says which connections made no progress (nothing
// unread, less than at the last sample, or `reads` moved) for `timeout`. Not thread-safe.
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
  std::vector<uint64_t> Update(absl::Time now, const std::vector<UnreadSample>& samples,
                               const Quiet& quiet = nullptr);
  absl::Duration timeout() const { return timeout_; }

 private:
  struct Seen {
    uint64_t unread = 0;
    uint64_t reads = 0;
    absl::Time progress;  // last sample with nothing unread or less than before
    absl::Time stuck_since = absl::InfiniteFuture();  // first sample after `progress`
  };
  const absl::Duration timeout_;
  std::map<uint64_t, Seen> seen_;
};

// Samples the connections in `table` every `period` on a thread it owns (started here, stopped
// and joined by the destructor) and shuts down those the tracker names; `log` gets one line per
// connection dropped and `metrics` (may be null) counts it. `table` and `metrics` must outlive
// this. Thread-safe.
class UnreadGuard {
 public:
  UnreadGuard(const ConnectionTable* table, absl::Duration timeout, absl::Duration period,
              std::function<void(const std::string&)> log, Metrics* metrics = nullptr);
  ~UnreadGuard();
  UnreadGuard(const UnreadGuard&) = delete;
  UnreadGuard& operator=(const UnreadGuard&) = delete;

 private:
  void Loop();
  void Sweep();
  // Counts the unix peers' reads since the last call (edges of write space).
  void CountReads();

  const ConnectionTable* const table_;
  const absl::Duration period_;
  const std::function<void(const std::string&)> log_;
  Metrics* const metrics_;
  // The loop's only:
  UnreadTracker tracker_;
  edge::UniqueFd epoll_;
  std::map<uint64_t, uint64_t> reads_;  // connection id -> write-space edges seen
  absl::Notification stop_;
  std::thread thread_;  // last: starts once everything above is ready
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_UNREAD_GUARD_H_
