#ifndef KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
#define KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_

// kvtierd's memory channel (edge/memory_channel.h): accepts one connection at a time, reads the
// caller's credentials from the kernel, answers one request (a hello, or a worker's extents as
// descriptors) and closes. A caller that sends nothing is dropped after a short timeout, so it
// cannot hold the channel.

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "daemon/daemon_core.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// One owner: the constructor starts the thread, the destructor stops and joins it.
// Thread-safe: the core is.
class ChannelServer {
 public:
  using LogFn = std::function<void(const std::string&)>;
  // `listener` is a listening SOCK_SEQPACKET socket; `core` must outlive this.
  ChannelServer(edge::UniqueFd listener, DaemonCore* core, LogFn log_debug);
  ~ChannelServer();
  ChannelServer(const ChannelServer&) = delete;
  ChannelServer& operator=(const ChannelServer&) = delete;

 private:
  void Loop();
  void Serve(int connection);

  edge::UniqueFd listener_;
  DaemonCore* const core_;
  const LogFn log_debug_;
  edge::UniqueFd wake_read_, wake_write_;  // a pipe that interrupts poll() at shutdown
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_CHANNEL_SERVER_H_
