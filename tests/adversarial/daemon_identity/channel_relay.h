#ifndef KVTIER_TESTS_ADVERSARIAL_DAEMON_IDENTITY_CHANNEL_RELAY_H_
#define KVTIER_TESTS_ADVERSARIAL_DAEMON_IDENTITY_CHANNEL_RELAY_H_

// An impostor on the memory channel: a process of its own (forked, then running as `uid`) that
// listens at a path of its choosing and relays every request to the real daemon's channel and
// every reply back, with the reply's descriptors, as a local account that can bind a socket
// where workers look for the daemon would. It can also forge the extents it passes on. It
// reports what it saw on a pipe. Not thread-safe.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

struct RelayOptions {
  std::string listen_path;  // where the relay binds its socket (its directory writable by `uid`)
  std::string upstream;     // the real daemon's channel
  uid_t uid = 0;            // the relay's uid and gid (set before it binds)
  gid_t gid = 0;
  // Extents of a FetchExtents reply replaced by memfds of twice the size (sealed), or of the
  // right size but unsealed; kNone: passed on as the daemon sent them.
  enum class Forge { kNone, kWrongSize, kUnsealed } forge = Forge::kNone;
  absl::Duration lifetime = absl::Seconds(30);  // the relay exits after this, whatever happens
};

// What the relay saw, counted since it started.
struct RelayReport {
  int requests = 0;     // requests relayed
  int secrets = 0;      // of which carried a session secret
  int descriptors = 0;  // descriptors of the daemon's replies it held
  int pages_read = 0;   // extents it mapped and read a byte of
};

class ChannelRelay {
 public:
  // Forks the relay and waits (bounded) until it listens at options.listen_path.
  static absl::StatusOr<std::unique_ptr<ChannelRelay>> Start(const RelayOptions& options);
  ~ChannelRelay();  // SIGKILL and reap

  // The latest report the relay sent (non-blocking).
  RelayReport Report();

 private:
  ChannelRelay(pid_t pid, int report_fd) : pid_(pid), report_fd_(report_fd) {}
  pid_t pid_;
  int report_fd_;
  RelayReport last_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_ADVERSARIAL_DAEMON_IDENTITY_CHANNEL_RELAY_H_
