#ifndef KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
#define KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_

// kvtierd's memory channel (edge/memory_channel.h): a few threads accept connections, read the
// caller's credentials from the kernel, answer one request each (a hello, or a worker's extents
// as descriptors) and close. A caller that sends nothing is dropped after a short timeout and
// holds one thread at most, so a stuck or hostile client cannot close the channel to others. A
// connection that opens with a heartbeat, or with a snapshot, is kept for the worker's later ones
// of that kind (channel_lane.h).

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/daemon_core.h"
#include "daemon/kvtierd/channel_lane.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// One owner: the constructor starts the threads, the destructor stops and joins them.
// Thread-safe: the core is.
class ChannelServer {
 public:
  using LogFn = std::function<void(const std::string&)>;
  // `listener` is a listening SOCK_SEQPACKET socket; `core` must outlive this.
  static constexpr int kThreads = 4;
  // `log_info` and `log_warning` serve the lanes (channel_lane.h); `log_debug` the rest.
  ChannelServer(edge::UniqueFd listener, DaemonCore* core, ChannelLaneOptions heartbeats,
                ChannelLaneOptions snapshots, LogFn log_info, LogFn log_warning, LogFn log_debug);
  ~ChannelServer();
  ChannelServer(const ChannelServer&) = delete;
  ChannelServer& operator=(const ChannelServer&) = delete;

 private:
  void Loop();
  void Serve(edge::UniqueFd connection);

  edge::UniqueFd listener_;
  DaemonCore* const core_;
  const LogFn log_debug_;
  edge::UniqueFd wake_read_, wake_write_;  // a pipe that interrupts poll() at shutdown
  ChannelLane heartbeats_;                 // the lanes outlive the threads that hand them
  ChannelLane snapshots_;                  // connections
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
