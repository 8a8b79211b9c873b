#ifndef KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
#define KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_

// kvtierd's memory channel (edge/memory_channel.h): one thread runs an event loop (epoll, every
// socket non-blocking) that accepts connections, reads the caller's credentials from the kernel,
// answers one request each (a hello, or a worker's extents as descriptors) and closes. Nothing a
// peer does can make that thread wait on it:
//  - a connection that has not sent a whole request within the deadline is dropped; the ones
//    waiting cost a slot each of their uid's budget and of a cap for the channel, so silent peers
//    of one uid cannot take every slot;
//  - a request that comes with descriptors attached is refused (the channel never asks a peer for
//    one) and its connection dropped; those descriptors, and every connection, close on the
//    descriptor sink's thread (descriptor_sink.h), never here;
//  - accept() out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) pauses accepting,
//    with a backoff, instead of spinning, and says so in the log (once per 10 s at most);
//  - shutdown stops the loop and the lanes within a bound, and leaves a stuck sink behind.
// A connection that opens with a heartbeat, or with a snapshot, is kept for the worker's later
// ones of that kind (channel_lane.h).

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "daemon/daemon_core.h"
#include "daemon/kvtierd/channel_lane.h"
#include "daemon/kvtierd/descriptor_sink.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

struct ChannelServerLimits {
  int max_connections = 512;         // waiting for their request, all peers together
  int max_connections_per_uid = 64;  // of those, from one uid
  absl::Duration request_timeout = absl::Milliseconds(500);  // connect to whole request
  absl::Duration sink_stall_warning = absl::Seconds(1);      // a close blocked this long is logged
  DescriptorSink::Options sink;
};

// One owner: the constructor starts the loop's thread, the destructor stops and joins it.
// Thread-safe: the core is.
class ChannelServer {
 public:
  using LogFn = std::function<void(const std::string&)>;
  // `listener` is a listening SOCK_SEQPACKET socket; `core` must outlive this. `log_info` and
  // `log_warning` serve the lanes (channel_lane.h) and the server's own warnings (accept paused, a
  // stalled sink); `log_debug` hears of each request refused. Metrics: `heartbeats.metrics`.
  ChannelServer(edge::UniqueFd listener, DaemonCore* core, ChannelLaneOptions heartbeats,
                ChannelLaneOptions snapshots, LogFn log_info, LogFn log_warning, LogFn log_debug,
                ChannelServerLimits limits = {});
  ~ChannelServer();
  ChannelServer(const ChannelServer&) = delete;
  ChannelServer& operator=(const ChannelServer&) = delete;

 private:
  struct Pending {
    edge::UniqueFd fd;
    edge::PeerCredentials peer;
    absl::Time deadline;
  };

  void Loop();
  // Accepts what the listener holds, within the budgets; pauses accepting when out of
  // descriptors.
  void AcceptAll(absl::Time now);
  // Reads and answers the request on `fd`, if it came; closes the connection unless a lane took
  // it or its request is still to come.
  void Serve(int fd);
  // Answers one request; a connection a lane adopts is moved out of `c`.
  void Answer(Pending& c, const v1::ChannelRequest& request);
  // Sends `status` to the peer (if it can take it now) and closes the connection on the sink.
  void Refuse(edge::UniqueFd fd, const absl::Status& status);
  // Forgets a waiting connection (and its uid's slot); returns it.
  Pending Take(int fd);
  void DropExpired(absl::Time now);
  void WatchSink();
  void WatchListener(bool on);
  void Count(Metrics::ConnectionDrop reason);
  void Gauge();

  const ChannelServerLimits limits_;
  DaemonCore* const core_;
  Metrics* const metrics_;
  const LogFn log_warning_, log_debug_;
  // Declared first, destroyed last: the lanes and the loop hand it descriptors until they stop.
  DescriptorSink sink_;
  edge::UniqueFd listener_;
  edge::UniqueFd epoll_, wake_read_, wake_write_;  // the pipe interrupts epoll_wait at shutdown
  ChannelLane heartbeats_;                         // the lanes outlive the loop that hands them
  ChannelLane snapshots_;                          // connections
  // The loop's own.
  absl::flat_hash_map<int, Pending> pending_;
  absl::flat_hash_map<uid_t, int> per_uid_;
  bool listening_ = true;
  absl::Time accept_resumes_ = absl::InfinitePast();
  absl::Duration accept_backoff_ = absl::ZeroDuration();
  absl::Time accept_warned_ = absl::InfinitePast();
  int64_t accept_failures_ = 0;
  bool sink_warned_ = false;
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
