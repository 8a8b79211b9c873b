#ifndef KVTIER_DAEMON_KVTIERD_DESCRIPTOR_SINK_H_
#define KVTIER_DAEMON_KVTIERD_DESCRIPTOR_SINK_H_

// Closes the descriptors that peers control, off the threads that serve peers.
//
// close() can block on what a peer chose: a TCP socket with SO_LINGER and unsent data waits out
// its linger time, a file on a stuck FUSE or NFS mount waits for its server, and closing a unix
// connection with SCM_RIGHTS messages still queued drops their files in the closing thread's
// context (so a lingering socket inside one blocks that close too). The memory channel's threads
// never call close() on such a descriptor: they hand it here, to one thread of its own. Sockets
// get SO_LINGER {1, 0} on the way in, so their close is immediate, and unix sockets are drained
// of queued messages (their descriptors handled alike) before they close. What can still block
// blocks the sink alone: Stalled() says for how long, and the channel's owner logs it and shows
// it as a metric (kvtier_channel_sink_stalled_seconds) rather than wedging.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// One owner: the constructor starts the thread, the destructor stops it. Thread-safe.
class DescriptorSink {
 public:
  struct Options {
    // Descriptors waiting to close; producers check Full() and stop taking new ones past it
    // (Close() itself never refuses or waits).
    size_t capacity = 4096;
    // At destruction, how long the queue may take to close before the thread is left behind
    // (stuck in a close() that the process's exit ends).
    absl::Duration shutdown_wait = absl::Seconds(1);
    // Hears that the destructor left the thread behind. May be empty.
    std::function<void(const std::string&)> log_warning;
  };

  explicit DescriptorSink(Options options);
  DescriptorSink() : DescriptorSink(Options{}) {}
  ~DescriptorSink();
  DescriptorSink(const DescriptorSink&) = delete;
  DescriptorSink& operator=(const DescriptorSink&) = delete;

  // Takes `fd` to close it on the sink's thread; never blocks.
  void Close(edge::UniqueFd fd);
  void Close(std::vector<edge::UniqueFd> fds);

  // Descriptors waiting to close.
  size_t backlog() const;
  // The backlog reached the capacity.
  bool Full() const;
  // How long the close under way has taken; zero when the sink is idle.
  absl::Duration Stalled() const;

 private:
  struct State;
  const Options options_;
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this
  std::thread thread_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_DESCRIPTOR_SINK_H_
