#include "edge/memory_channel.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "edge/message_limits.h"

namespace kvtier::edge {
namespace {

absl::Status Errno(absl::string_view what) {
  const int err = errno;
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOENT || err == ECONNREFUSED || err == EPIPE || err == ECONNRESET) {
    return absl::UnavailableError(msg);  // no daemon there, or it closed the connection
  }
  if (err == EAGAIN || err == EWOULDBLOCK) return absl::DeadlineExceededError(msg);
  return absl::InternalError(msg);
}

void SetTimeouts(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("channel path \"", path, "\" must be 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes long"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) Reset(other.Release());
  return *this;
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::StatusOr<PeerCredentials> PeerOf(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Errno("SO_PEERCRED");
  }
  PeerCredentials peer{cred.uid, cred.gid, cred.pid, {}};
  std::vector<gid_t> groups(64);
  len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0 &&
      errno == ERANGE) {
    groups.resize(len / sizeof(gid_t));
    if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) len = 0;
  }
  groups.resize(len / sizeof(gid_t));
  peer.groups = std::move(groups);
  return peer;
}

std::string ChannelPathFor(const std::string& socket_path) { return socket_path + ".mem"; }

absl::StatusOr<std::string> UnixSocketPath(const std::string& address) {
  if (!absl::StartsWith(address, "unix:") || address.size() <= 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address,
                     "\": workers need the unix socket (unix:PATH); TCP carries neither the "
                     "peer's credentials nor its memory"));
  }
  return address.substr(5);
}

absl::Status SendMessage(int socket_fd, const google::protobuf::MessageLite& message,
                         absl::Span<const int> fds) {
  if (fds.size() > static_cast<size_t>(kMaxFdsPerMessage)) {
    return absl::InvalidArgumentError(
        absl::StrCat(fds.size(), " descriptors exceed ", kMaxFdsPerMessage, " per message"));
  }
  std::string bytes = message.SerializeAsString();
  if (bytes.size() > kMaxChannelMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("channel message of ", bytes.size(),
                                                   " bytes exceeds ", kMaxChannelMessageBytes));
  }
  if (bytes.empty()) bytes.push_back('\0');  // a zero-length datagram reads as end of stream
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("sendmsg on the memory channel");
  return absl::OkStatus();
}

void CollectDescriptors(msghdr& msg, std::vector<UniqueFd>* out) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out->emplace_back(fd);
    }
  }
}

absl::Status ReceiveWithDescriptors(int socket_fd, google::protobuf::MessageLite* message,
                                    std::vector<UniqueFd>* attached) {
  // One buffer per thread: heartbeats come many times a second on the daemon's lane.
  thread_local std::string bytes(kMaxChannelMessageBytes, '\0');
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerDatagram)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("recvmsg on the memory channel");
  CollectDescriptors(msg, attached);
  if (n == 0) return absl::UnavailableError("the memory channel closed before a message came");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return absl::InvalidArgumentError(
        "memory channel message truncated (too long or too many "
        "descriptors)");
  }
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(n)) &&
      !(n == 1 && bytes[0] == '\0' && message->ParseFromArray(bytes.data(), 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory channel message of ", n, " bytes is not a ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UniqueFd>> ReceiveMessage(int socket_fd,
                                                     google::protobuf::MessageLite* message) {
  std::vector<UniqueFd> fds;
  if (absl::Status s = ReceiveWithDescriptors(socket_fd, message, &fds); !s.ok()) return s;
  return fds;
}

v1::ChannelReply ChannelErrorReply(const absl::Status& status) {
  v1::ChannelReply reply;
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  return reply;
}

absl::StatusOr<UniqueFd> ConnectChannel(const std::string& channel_path, absl::Duration timeout,
                                        const DaemonUids* daemon) {
  absl::StatusOr<sockaddr_un> addr = Address(channel_path);
  if (!addr.ok()) return addr.status();
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  SetTimeouts(sock.get(), timeout);
  if (connect(sock.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("connect to the memory channel ", channel_path));
  }
  if (daemon != nullptr) {
    if (absl::Status s = CheckDaemonPeer(sock.get(), channel_path, *daemon); !s.ok()) return s;
  }
  return sock;
}

absl::StatusOr<v1::ChannelReply> ChannelExchange(int socket_fd, const v1::ChannelRequest& request,
                                                 std::vector<UniqueFd>* fds) {
  if (absl::Status s = SendMessage(socket_fd, request, {}); !s.ok()) return s;
  v1::ChannelReply reply;
  absl::StatusOr<std::vector<UniqueFd>> received = ReceiveMessage(socket_fd, &reply);
  if (!received.ok()) return received.status();
  if (reply.code() != 0) {
    const int code = reply.code() > 0 && reply.code() <= 16 ? reply.code() : 13;  // INTERNAL
    return absl::Status(static_cast<absl::StatusCode>(code), reply.message());
  }
  if (fds != nullptr) *fds = *std::move(received);
  return reply;
}

absl::StatusOr<v1::ChannelReply> ChannelCall(const std::string& channel_path,
                                             const v1::ChannelRequest& request,
                                             std::vector<UniqueFd>* fds, absl::Duration timeout,
                                             const DaemonUids* daemon) {
  absl::StatusOr<UniqueFd> sock = ConnectChannel(channel_path, timeout, daemon);
  if (!sock.ok()) return sock.status();
  return ChannelExchange(sock->get(), request, fds);
}

absl::StatusOr<UniqueFd> ListenChannel(const std::string& path, uint32_t mode, gid_t gid) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    unlink(path.c_str());  // the gRPC socket beside it was found stale, so is this one
  }
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  if (bind(sock.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("bind ", path));
  }
  if (chmod(path.c_str(), static_cast<mode_t>(mode & 0777)) != 0) {
    return Errno(absl::StrCat("chmod ", path));
  }
  if (gid != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return Errno(absl::StrCat("chown ", path, " to gid ", gid));
  }
  if (listen(sock.get(), 128) != 0) return Errno(absl::StrCat("listen ", path));
  return sock;
}

}  // namespace kvtier::edge
