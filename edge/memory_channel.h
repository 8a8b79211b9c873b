#ifndef KVTIER_EDGE_MEMORY_CHANNEL_H_
#define KVTIER_EDGE_MEMORY_CHANNEL_H_

// The memory channel's framing (docs/security.md): a unix SOCK_SEQPACKET socket beside the gRPC
// socket; one request and one reply per connection, each one serialized kvtier.v1 message in one
// datagram, the reply's file descriptors attached with SCM_RIGHTS. The server learns the peer
// from the kernel (SO_PEERCRED, SO_PEERGROUPS), never from the message.

#include <sys/socket.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "edge/daemon_identity.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::edge {

// The most descriptors one reply carries (the kernel's limit is 253).
inline constexpr int kMaxFdsPerMessage = 65;
// The most descriptors the kernel attaches to one unix datagram (SCM_MAX_FD).
inline constexpr int kMaxFdsPerDatagram = 253;

// A file descriptor closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Who is on the other end of a unix socket, as the kernel says.
struct PeerCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  std::vector<gid_t> groups;  // supplementary groups (SO_PEERGROUPS)
};

absl::StatusOr<PeerCredentials> PeerOf(int socket_fd);

// The channel's path for a gRPC unix socket path.
std::string ChannelPathFor(const std::string& socket_path);
// The socket path of a gRPC address "unix:PATH"; INVALID_ARGUMENT for any other (TCP carries no
// kernel credentials and no descriptors).
absl::StatusOr<std::string> UnixSocketPath(const std::string& address);

// Sends `message` with `fds` attached in one datagram.
absl::Status SendMessage(int socket_fd, const google::protobuf::MessageLite& message,
                         absl::Span<const int> fds);
// Receives one datagram into `message`, taking ownership of the descriptors attached. A
// truncated datagram or descriptor list is INVALID_ARGUMENT (the descriptors are closed).
absl::StatusOr<std::vector<UniqueFd>> ReceiveMessage(int socket_fd,
                                                     google::protobuf::MessageLite* message);
// As ReceiveMessage, but every descriptor attached comes back in `*attached` whatever the status,
// so that the caller decides on which thread they close: closing a descriptor a peer chose can
// block (a TCP socket lingering on unsent data, a file on a stuck FUSE mount). The control
// buffer takes the kernel's most (SCM_MAX_FD) so that none is dropped, and closed, by recvmsg.
// Appends the descriptors attached (SCM_RIGHTS) to a message recvmsg filled in to `*out`.
void CollectDescriptors(msghdr& msg, std::vector<UniqueFd>* out);
absl::Status ReceiveWithDescriptors(int socket_fd, google::protobuf::MessageLite* message,
                                    std::vector<UniqueFd>* attached);

// Server side: the reply that carries `status` (not OK) to the caller.
v1::ChannelReply ChannelErrorReply(const absl::Status& status);

// Client side: a connection to `channel_path` whose sends and receives block at most `timeout`.
// With `daemon`, the peer must be one of its uids (CheckDaemonPeer): a client checks every
// connection, so that nobody who can bind a socket at the path hears what it says.
absl::StatusOr<UniqueFd> ConnectChannel(const std::string& channel_path, absl::Duration timeout,
                                        const DaemonUids* daemon = nullptr);
// Sends `request` on a connected socket and returns the reply and its descriptors. A reply whose
// code is not OK comes back as that status with its message.
absl::StatusOr<v1::ChannelReply> ChannelExchange(int socket_fd, const v1::ChannelRequest& request,
                                                 std::vector<UniqueFd>* fds);
// Both, on a connection of its own: connects to `channel_path`, sends `request`, returns the
// reply. No step blocks longer than `timeout`. `daemon` as in ConnectChannel.
absl::StatusOr<v1::ChannelReply> ChannelCall(const std::string& channel_path,
                                             const v1::ChannelRequest& request,
                                             std::vector<UniqueFd>* fds,
                                             absl::Duration timeout = absl::Seconds(2),
                                             const DaemonUids* daemon = nullptr);

// Server side: a listening SOCK_SEQPACKET socket at `path` (an existing socket file is
// replaced), mode `mode`, optionally given to group `gid` (-1 = leave).
absl::StatusOr<UniqueFd> ListenChannel(const std::string& path, uint32_t mode, gid_t gid);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_MEMORY_CHANNEL_H_
