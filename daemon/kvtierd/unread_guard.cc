#include "daemon/kvtierd/unread_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace {

// A duplicate of the connection's descriptor if it is still that socket (gRPC owns the
// descriptor and may have closed it, and the number been reused, since the table's snapshot),
// else none.
edge::UniqueFd DupIfSame(const Connection& c) {
  edge::UniqueFd fd(fcntl(c.fd, F_DUPFD_CLOEXEC, 0));
  if (fd.valid() && !SameFile(fd.get(), c.dev, c.inode)) fd.Reset();
  return fd;
}

// A TCP connection's peer is on this host (server.tcp is loopback only), so the kernel can say
// what the peer's process has not read: its socket's receive queue, and how much it read in all
// (bytes received less those still queued). Asked by address through NETLINK_SOCK_DIAG. HTTP/2
// flow control keeps gRPC from writing past a peer's window, so a TCP peer that reads nothing
// leaves nothing unacknowledged on the daemon's side: only its own socket shows it. False when
// the peer's socket is not found (another network namespace, or gone).
bool PeerQueue(int fd, uint64_t* unread, uint64_t* reads) {
  sockaddr_storage local{}, remote{};
  socklen_t ln = sizeof(local), rn = sizeof(remote);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ln) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rn) != 0) {
    return false;
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.req.sdiag_family = static_cast<uint8_t>(remote.ss_family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_ext = 1 << (INET_DIAG_INFO - 1);
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  // The peer's socket: its source is our destination.
  if (remote.ss_family == AF_INET) {
    const auto* r = reinterpret_cast<const sockaddr_in*>(&remote);
    const auto* l = reinterpret_cast<const sockaddr_in*>(&local);
    msg.req.id.idiag_sport = r->sin_port;
    msg.req.id.idiag_dport = l->sin_port;
    std::memcpy(msg.req.id.idiag_src, &r->sin_addr, 4);
    std::memcpy(msg.req.id.idiag_dst, &l->sin_addr, 4);
  } else {
    const auto* r = reinterpret_cast<const sockaddr_in6*>(&remote);
    const auto* l = reinterpret_cast<const sockaddr_in6*>(&local);
    msg.req.id.idiag_sport = r->sin6_port;
    msg.req.id.idiag_dport = l->sin6_port;
    std::memcpy(msg.req.id.idiag_src, &r->sin6_addr, 16);
    std::memcpy(msg.req.id.idiag_dst, &l->sin6_addr, 16);
  }
  const edge::UniqueFd nl(socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid() || send(nl.get(), &msg, sizeof(msg), 0) != sizeof(msg)) return false;
  alignas(nlmsghdr) char buf[8192];
  const ssize_t n = recv(nl.get(), buf, sizeof(buf), 0);
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
  if (n <= 0 || !NLMSG_OK(h, static_cast<uint32_t>(n)) || h->nlmsg_type != SOCK_DIAG_BY_FAMILY) {
    return false;
  }
  const auto* diag = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h));
  *unread = diag->idiag_rqueue;
  *reads = 0;
  int left = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*diag)));
  for (const rtattr* a = reinterpret_cast<const rtattr*>(diag + 1); RTA_OK(a, left);
       a = RTA_NEXT(a, left)) {
    if (a->rta_type != INET_DIAG_INFO) continue;
    tcp_info info{};
    std::memcpy(&info, RTA_DATA(a), std::min<size_t>(RTA_PAYLOAD(a), sizeof(info)));
    *reads = info.tcpi_bytes_received - diag->idiag_rqueue;
  }
  return true;
}

// The peer, for the log: pid 0 is a peer in another pid namespace, not a process.
std::string Who(const Connection& c) {
  if (!c.uid.has_value()) return "a TCP peer";
  if (c.pid == 0) return absl::StrCat("uid ", *c.uid, " (pid not visible here)");
  return absl::StrCat("pid ", c.pid, " uid ", *c.uid);
}

}  // namespace

std::vector<uint64_t> UnreadTracker::Update(absl::Time now,
                                            const std::vector<UnreadSample>& samples,
                                            const Quiet& quiet) {
  std::map<uint64_t, Seen> next;
  std::vector<uint64_t> drop;
  for (const UnreadSample& sample : samples) {
    auto it = seen_.find(sample.key);
    Seen s = it == seen_.end() ? Seen{sample.unread, sample.reads, now} : it->second;
    if (sample.unread == 0 || sample.unread < s.unread || sample.reads != s.reads) {
      s.progress = now;
      s.stuck_since = absl::InfiniteFuture();
    } else if (s.stuck_since == absl::InfiniteFuture()) {
      s.stuck_since = now;
    }
    s.unread = sample.unread;
    s.reads = sample.reads;
    if (now - s.progress >= timeout_) {
      if (!quiet || !quiet(sample.key, now - s.stuck_since)) {
        drop.push_back(sample.key);
        continue;  // forgotten: seen again, it starts over
      }
      s.progress = s.stuck_since = now;  // paused, not stuck: a fresh clock from here
    }
    next[sample.key] = s;
  }
  seen_ = std::move(next);
  return drop;
}

UnreadGuard::UnreadGuard(const ConnectionTable* table, absl::Duration timeout,
                         absl::Duration period, std::function<void(const std::string&)> log,
                         Metrics* metrics)
    : table_(table),
      period_(period),
      log_(std::move(log)),
      metrics_(metrics),
      tracker_(timeout),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      thread_([this] { Loop(); }) {}

UnreadGuard::~UnreadGuard() {
  stop_.Notify();
  thread_.join();
}

void UnreadGuard::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(period_)) Sweep();
}

void UnreadGuard::CountReads() {
  epoll_event events[256];
  int n = 0;
  do {
    n = epoll_wait(epoll_.get(), events, 256, 0);
    for (int i = 0; i < n; ++i) {
      auto it = reads_.find(events[i].data.u64);
      if (it != reads_.end()) ++it->second;
    }
  } while (n == 256);
}

void UnreadGuard::Sweep() {
  CountReads();
  const absl::Time now = absl::Now();
  const std::vector<Connection> connections = table_->Snapshot();
  std::map<uint64_t, const Connection*> by_id;
  std::map<uint64_t, uint64_t> reads;
  std::vector<UnreadSample> samples;
  for (const Connection& c : connections) {
    const edge::UniqueFd fd = DupIfSame(c);
    if (!fd.valid()) continue;
    UnreadSample sample{.key = c.id};
    if (c.uid.has_value()) {
      // The registration outlives the duplicate: it lasts while gRPC holds the socket.
      auto it = reads_.find(c.id);
      if (it == reads_.end()) {
        epoll_event ev{};
        ev.events = EPOLLOUT | EPOLLET;
        ev.data.u64 = c.id;
        epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev);
      }
      sample.reads = reads[c.id] = it == reads_.end() ? 0 : it->second;
    }
    int unread = 0;
    if (ioctl(fd.get(), SIOCOUTQ, &unread) != 0) continue;
    sample.unread = static_cast<uint64_t>(unread);
    uint64_t peer_unread = 0;
    if (!c.uid.has_value() && PeerQueue(fd.get(), &peer_unread, &sample.reads)) {
      sample.unread += peer_unread;
    }
    samples.push_back(sample);
    by_id[c.id] = &c;
  }
  reads_ = std::move(reads);
  // Paused, not stuck: the connection made a call, and none since its bytes went unread.
  const auto quiet = [&](uint64_t id, absl::Duration stuck_for) {
    const absl::Time last_call = by_id[id]->last_call;
    return last_call != absl::InfinitePast() && now - last_call >= stuck_for;
  };
  for (uint64_t id : tracker_.Update(now, samples, quiet)) {
    const Connection& c = *by_id[id];
    const edge::UniqueFd fd = DupIfSame(c);
    if (!fd.valid()) continue;
    int unread = 0;
    ioctl(fd.get(), SIOCOUTQ, &unread);
    shutdown(fd.get(), SHUT_RDWR);
    if (metrics_ != nullptr) metrics_->CountDroppedConnection(Metrics::ConnectionDrop::kGrpcUnread);
    log_(absl::StrCat("dropped a connection whose peer stopped reading: ", Who(c), " left ", unread,
                      " bytes unread for ", absl::FormatDuration(tracker_.timeout()),
                      " (server.unread_timeout_ms)"));
  }
}

}  // namespace kvtier::daemon
