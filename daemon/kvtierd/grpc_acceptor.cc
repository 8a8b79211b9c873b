#include "daemon/kvtierd/grpc_acceptor.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace {

constexpr int kBacklog = 128;
constexpr int kAcceptsPerWake = 64;  // then the other listener gets its turn
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(10);
constexpr absl::Duration kLastBackoff = absl::Seconds(1);
constexpr absl::Duration kPrunePeriod = absl::Milliseconds(100);

void AppendFrame(std::string* out, uint8_t type, uint32_t stream, const std::string& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  const char head[9] = {static_cast<char>(n >> 16),
                        static_cast<char>(n >> 8),
                        static_cast<char>(n),
                        static_cast<char>(type),
                        0,
                        static_cast<char>(stream >> 24),
                        static_cast<char>(stream >> 16),
                        static_cast<char>(stream >> 8),
                        static_cast<char>(stream)};
  out->append(head, 9);
  out->append(payload);
}

// The server's HTTP/2 preface (an empty SETTINGS) and a GOAWAY (ENHANCE_YOUR_CALM, no stream
// processed) whose debug text a gRPC client reports: the refusal names the limit.
std::string RefusalFrames(const std::string& why) {
  std::string goaway(8, '\0');  // last stream id 0, then the error code
  goaway[7] = 0x0b;             // ENHANCE_YOUR_CALM
  goaway += why.substr(0, 512);
  std::string out;
  AppendFrame(&out, /*SETTINGS*/ 4, 0, "");
  AppendFrame(&out, /*GOAWAY*/ 7, 0, goaway);
  return out;
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<edge::UniqueFd> ListenUnix(const std::string& path) {
  edge::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  if (!fd.valid()) return Errno("socket(AF_UNIX)");
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("server.socket \"", path, "\" is too long"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("bind unix:", path));
  }
  if (listen(fd.get(), kBacklog) != 0) return Errno(absl::StrCat("listen unix:", path));
  return fd;
}

absl::StatusOr<edge::UniqueFd> ListenTcp(const std::string& address, int* port, const char* field) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, " \"", address, "\" has no port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string service = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", address, "\": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat(field, " \"", address, "\""));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    edge::UniqueFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (!fd.valid() || bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        listen(fd.get(), kBacklog) != 0) {
      last = Errno(absl::StrCat("listen on ", address));
      continue;
    }
    sockaddr_storage bound{};
    socklen_t n = sizeof(bound);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &n);
    *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  return last;
}

int DescriptorCap() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return INT_MAX;
  return static_cast<int>(std::min<rlim_t>(limit.rlim_cur / 2, INT_MAX));
}

GrpcAcceptor::GrpcAcceptor(std::vector<Listener> listeners, ConnectionCaps caps,
                           ConnectionTable* table, std::function<void(int fd)> serve,
                           std::function<void(const std::string&)> log, Metrics* metrics)
    : listeners_(std::move(listeners)),
      table_(table),
      serve_(std::move(serve)),
      log_(std::move(log)),
      metrics_(metrics),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      reserve_(open("/dev/null", O_RDONLY | O_CLOEXEC)),
      limits_(caps),
      backoff_(kFirstBackoff),
      thread_([this] { Loop(); }) {}

GrpcAcceptor::~GrpcAcceptor() {
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void GrpcAcceptor::Loop() {
  std::vector<pollfd> fds;
  for (const Listener& l : listeners_) fds.push_back({l.fd.get(), POLLIN, 0});
  fds.push_back({wake_.get(), POLLIN, 0});
  for (;;) {
    // Out of descriptors, the listeners stay readable: wait out the backoff on the stop alone.
    pollfd* const first = starved_ ? &fds.back() : fds.data();
    const nfds_t n = starved_ ? 1 : fds.size();
    const absl::Duration wait = starved_ ? backoff_ : kPrunePeriod;
    for (size_t i = 0; i < fds.size(); ++i) fds[i].revents = 0;
    if (poll(first, n, static_cast<int>(absl::ToInt64Milliseconds(wait))) < 0 && errno != EINTR) {
      log_(absl::StrCat("gRPC acceptor: poll: ", std::strerror(errno)));
      return;
    }
    if (fds.back().revents != 0) return;
    ReleaseClosed();
    bool fed = true;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (starved_ || (fds[i].revents & POLLIN) != 0) fed &= AcceptAll(listeners_[i]);
    }
    if (!fed) {
      if (!starved_) {
        log_(absl::StrCat("out of file descriptors (", std::strerror(errno),
                          "): refusing gRPC connections and retrying with backoff (",
                          limits_.open(), " open)"));
      }
      starved_ = true;
      backoff_ = std::min(backoff_ * 2, kLastBackoff);
    } else if (starved_) {
      starved_ = false;
      backoff_ = kFirstBackoff;
      log_("descriptors free again: accepting gRPC connections");
    }
  }
}

bool GrpcAcceptor::AcceptAll(const Listener& l) {
  for (int k = 0; k < kAcceptsPerWake; ++k) {
    const int fd = accept4(l.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(edge::UniqueFd(fd), l.tcp);
      continue;
    }
    switch (errno) {
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
        continue;
      case EMFILE:
      case ENFILE:
      case ENOBUFS:
      case ENOMEM: {
        // The reserve lets the waiting peer be accepted and closed: it learns at once instead
        // of hanging in the backlog, and the listener is not left readable for nothing.
        const int err = errno;
        reserve_.Reset();
        edge::UniqueFd shed(accept4(l.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
        const bool refused = shed.valid();
        shed.Reset();
        reserve_.Reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (refused && metrics_ != nullptr) {
          metrics_->CountDroppedConnection(Metrics::ConnectionDrop::kGrpcNoDescriptor);
        }
        errno = err;
        return false;
      }
      default:  // EAGAIN: nothing waits
        return true;
    }
  }
  return true;
}

void GrpcAcceptor::Admit(edge::UniqueFd fd, bool tcp) {
  std::optional<uid_t> uid;
  pid_t pid = 0;
  if (!tcp) {
    absl::StatusOr<edge::PeerCredentials> peer = edge::PeerOf(fd.get());
    if (!peer.ok()) return;  // gone already
    uid = peer->uid;
    pid = peer->pid;
  }
  if (absl::Status s = limits_.Admit(uid); !s.ok()) {
    Refuse(fd.get(), std::string(s.message()));
    return;
  }
  if (tcp) {
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  table_->Add(fd.get(), uid, pid);  // before gRPC reads a call from it
  serve_(fd.Release());
}

void GrpcAcceptor::ReleaseClosed() {
  for (const Connection& c : table_->Prune()) limits_.Release(c.uid);
}

void GrpcAcceptor::Refuse(int fd, const std::string& why) {
  const std::string frames = RefusalFrames(why);
  (void)!send(fd, frames.data(), frames.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_WR);
  if (metrics_ != nullptr) metrics_->CountDroppedConnection(Metrics::ConnectionDrop::kGrpcOverCap);
  ++refused_since_log_;
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ < absl::Seconds(1)) return;  // one line a second at most
  log_(absl::StrCat("refused ", refused_since_log_, " gRPC connection(s); the last: ", why));
  last_refusal_log_ = now;
  refused_since_log_ = 0;
}

}  // namespace kvtier::daemon
