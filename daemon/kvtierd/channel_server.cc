#include "daemon/kvtierd/channel_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "edge/peer_process.h"

namespace kvtier::daemon {
namespace {

// The loop wakes at least this often, to drop connections past their deadline and watch the
// sink: the deadlines' resolution.
constexpr int kTickMs = 50;
// Connections accepted per wake before the others get their turn.
constexpr int kAcceptBatch = 64;
constexpr absl::Duration kMinAcceptBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxAcceptBackoff = absl::Seconds(1);
constexpr absl::Duration kAcceptWarningEvery = absl::Seconds(10);

// accept() failures that more accepts cannot cure: the process or the system is out of
// descriptors or memory. Retrying at once would spin.
bool OutOfResources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

}  // namespace

ChannelServer::ChannelServer(edge::UniqueFd listener, DaemonCore* core,
                             ChannelLaneOptions heartbeats, ChannelLaneOptions snapshots,
                             LogFn log_info, LogFn log_warning, LogFn log_debug,
                             ChannelServerLimits limits)
    : limits_(limits),
      core_(core),
      metrics_(heartbeats.metrics),
      log_warning_(log_warning),
      log_debug_(std::move(log_debug)),
      sink_([&] {
        DescriptorSink::Options o = limits.sink;
        if (!o.log_warning) o.log_warning = log_warning;
        return o;
      }()),
      listener_(std::move(listener)),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      heartbeats_(ChannelLane::Lane::kHeartbeat, core, &sink_, heartbeats, log_info, log_warning),
      snapshots_(ChannelLane::Lane::kSnapshot, core, &sink_, snapshots, log_info, log_warning) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == 0) {
    wake_read_.Reset(fds[0]);
    wake_write_.Reset(fds[1]);
  }
  fcntl(listener_.get(), F_SETFL, fcntl(listener_.get(), F_GETFL) | O_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_read_.get();
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_read_.get(), &ev);
  ev.data.fd = listener_.get();
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev);
  thread_ = std::thread([this] { Loop(); });
}

ChannelServer::~ChannelServer() {
  if (wake_write_.valid()) (void)!write(wake_write_.get(), "x", 1);
  thread_.join();
  // Connections still in the listen queue may hold messages with descriptors: they close on the
  // sink too, and so does the listener (closing it would close any left).
  for (int i = 0; i < limits_.max_connections; ++i) {
    edge::UniqueFd c(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c.valid()) break;
    sink_.Close(std::move(c));
  }
  sink_.Close(std::move(listener_));
  // The lanes hand their connections to the sink as they stop; the sink, destroyed last, closes
  // what it holds within its shutdown_wait or leaves it behind.
}

void ChannelServer::Loop() {
  epoll_event events[64];
  for (;;) {
    const absl::Time now = absl::Now();
    DropExpired(now);
    WatchSink();
    // Past the sink's capacity nothing new is read or accepted (each could bring descriptors to
    // close) until it catches up; the deadlines still run.
    const bool full = sink_.Full();
    WatchListener(!full && now >= accept_resumes_);
    int n;
    if (full) {
      pollfd p{wake_read_.get(), POLLIN, 0};
      n = poll(&p, 1, kTickMs) > 0 ? -2 : 0;
    } else {
      n = epoll_wait(epoll_.get(), events, 64, kTickMs);
    }
    if (n == -2) break;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_read_.get()) {
        n = -2;
        break;
      }
      if (fd == listener_.get()) {
        AcceptAll(absl::Now());
      } else {
        Serve(fd);
      }
    }
    if (n == -2) break;
  }
  std::vector<int> left;
  for (const auto& [fd, c] : pending_) left.push_back(fd);
  for (int fd : left) sink_.Close(Take(fd).fd);
}

void ChannelServer::AcceptAll(absl::Time now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    edge::UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      // Out of descriptors (or anything else accept() keeps failing with): back off, doubling,
      // as level-triggered readiness would otherwise make this a busy loop; and say so at most
      // once per kAcceptWarningEvery, however often it fails.
      accept_backoff_ = std::clamp(2 * accept_backoff_, kMinAcceptBackoff, kMaxAcceptBackoff);
      accept_resumes_ = now + accept_backoff_;
      WatchListener(false);
      ++accept_failures_;
      if (now - accept_warned_ >= kAcceptWarningEvery) {
        log_warning_(absl::StrCat(
            "memory channel: accept: ", std::strerror(err),
            OutOfResources(err) ? " (out of descriptors or memory)" : "", "; ", accept_failures_,
            " failures in a row or since the last warning; accepting again after a backoff of up "
            "to ",
            absl::FormatDuration(kMaxAcceptBackoff), " (kvtier_channel_accept_paused)"));
        accept_warned_ = now;
        accept_failures_ = 0;
      }
      return;
    }
    accept_backoff_ = absl::ZeroDuration();
    absl::StatusOr<edge::PeerCredentials> peer = edge::PeerOf(fd.get());
    if (!peer.ok()) {
      Refuse(std::move(fd), peer.status());
      continue;
    }
    if (static_cast<int>(pending_.size()) >= limits_.max_connections) {
      Count(Metrics::ConnectionDrop::kChannelFull);
      Refuse(std::move(fd), absl::ResourceExhaustedError(absl::StrCat(
                                "memory channel: ", pending_.size(),
                                " connections wait for their request (max_connections ",
                                limits_.max_connections, "); try again")));
      continue;
    }
    int& of_uid = per_uid_[peer->uid];
    if (of_uid >= limits_.max_connections_per_uid) {
      Count(Metrics::ConnectionDrop::kChannelUidFull);
      Refuse(std::move(fd), absl::ResourceExhaustedError(absl::StrCat(
                                "memory channel: uid ", peer->uid, " has ", of_uid,
                                " connections waiting for their request (max_connections_per_uid ",
                                limits_.max_connections_per_uid, "); try again")));
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd.get();
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
      Refuse(std::move(fd), absl::ResourceExhaustedError("memory channel: cannot watch it"));
      continue;
    }
    ++of_uid;
    const int raw = fd.get();
    pending_.emplace(raw, Pending{std::move(fd), *std::move(peer), now + limits_.request_timeout});
  }
  Gauge();
}

void ChannelServer::Serve(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  v1::ChannelRequest request;
  std::vector<edge::UniqueFd> attached;
  const absl::Status s = edge::ReceiveWithDescriptors(fd, &request, &attached);
  if (!attached.empty()) {
    // The channel never asks a peer for a descriptor, and one could block whoever closes it.
    const size_t n = attached.size();
    sink_.Close(std::move(attached));
    Pending c = Take(fd);
    Count(Metrics::ConnectionDrop::kChannelDescriptors);
    log_debug_(absl::StrCat("memory channel: dropped uid ", c.peer.uid, " pid ", c.peer.pid,
                            ": it attached ", n, " descriptors to a request"));
    Refuse(std::move(c.fd),
           absl::InvalidArgumentError(absl::StrCat(
               "a memory channel request carries no descriptors; ", n, " came attached")));
    return;
  }
  if (!s.ok() && s.code() == absl::StatusCode::kDeadlineExceeded) return;  // nothing yet
  Pending c = Take(fd);
  if (!s.ok()) {
    log_debug_(absl::StrCat("memory channel: dropped a request: ", s.message()));
    Refuse(std::move(c.fd), s);
    return;
  }
  Answer(c, request);
  if (c.fd.valid()) sink_.Close(std::move(c.fd));
}

void ChannelServer::Answer(Pending& c, const v1::ChannelRequest& request) {
  std::vector<edge::UniqueFd> fds;  // the daemon's own extents: closing them never blocks
  absl::StatusOr<v1::ChannelReply> reply;
  // Hellos and fetches name the process (a pidfd): tickets are budgeted per process, and pool
  // memory stays charged until the process that received it exits. Without a pidfd the core
  // refuses CUDA VMM extents (and budgets tickets by uid).
  if (request.has_hello() || request.has_fetch_extents() || BlockIndex::Handles(request)) {
    auto process = edge::PeerProcess::OfSocket(c.fd.get(), c.peer.pid);
    if (process.ok()) c.peer.process = *std::move(process);
  }
  switch (request.op_case()) {
    case v1::ChannelRequest::kHello:
      reply = core_->Hello(c.peer);
      if (reply.ok()) reply->set_takes_snapshots(true);
      break;
    case v1::ChannelRequest::kFetchExtents:
      reply = core_->FetchExtents(c.peer, request.fetch_extents(), &fds);
      break;
    case v1::ChannelRequest::kHeartbeat:
      heartbeats_.Adopt(std::move(c.fd), c.peer, request);
      return;
    case v1::ChannelRequest::kSnapshot:
      snapshots_.Adopt(std::move(c.fd), c.peer, request);
      return;
    default:
      if (BlockIndex::Handles(request)) {
        reply = core_->blocks()->Handle(c.peer, request, &fds);
        break;
      }
      reply = absl::InvalidArgumentError(
          "channel request names no operation (hello, fetch_extents, heartbeat, snapshot or "
          "block_*)");
  }
  if (!reply.ok()) {
    log_debug_(absl::StrCat("memory channel: uid ", c.peer.uid, " pid ", c.peer.pid, ": ",
                            reply.status().message()));
    (void)edge::SendMessage(c.fd.get(), edge::ChannelErrorReply(reply.status()), {});
    return;
  }
  std::vector<int> raw;
  raw.reserve(fds.size());
  for (const edge::UniqueFd& fd : fds) raw.push_back(fd.get());
  // Non-blocking: the reply is the first datagram on a fresh connection, so it fits.
  absl::Status s = edge::SendMessage(c.fd.get(), *reply, raw);
  if (!s.ok()) log_debug_(absl::StrCat("memory channel: reply not sent: ", s.message()));
}

void ChannelServer::Refuse(edge::UniqueFd fd, const absl::Status& status) {
  if (!fd.valid()) return;
  (void)edge::SendMessage(fd.get(), edge::ChannelErrorReply(status), {});
  sink_.Close(std::move(fd));
}

ChannelServer::Pending ChannelServer::Take(int fd) {
  auto it = pending_.find(fd);
  Pending c = std::move(it->second);
  pending_.erase(it);
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  auto u = per_uid_.find(c.peer.uid);
  if (u != per_uid_.end() && --u->second <= 0) per_uid_.erase(u);
  Gauge();
  return c;
}

void ChannelServer::DropExpired(absl::Time now) {
  std::vector<int> expired;
  for (const auto& [fd, c] : pending_) {
    if (c.deadline <= now) expired.push_back(fd);
  }
  for (int fd : expired) {
    Pending c = Take(fd);
    Count(Metrics::ConnectionDrop::kChannelDeadline);
    Refuse(std::move(c.fd), absl::DeadlineExceededError(absl::StrCat(
                                "memory channel: no whole request within ",
                                absl::FormatDuration(limits_.request_timeout), " of connecting")));
  }
}

void ChannelServer::WatchSink() {
  const absl::Duration stalled = sink_.Stalled();
  if (metrics_ != nullptr) {
    metrics_->SetDescriptorSink(sink_.backlog(), absl::ToDoubleSeconds(stalled));
  }
  if (!sink_warned_ && stalled >= limits_.sink_stall_warning) {
    sink_warned_ = true;
    log_warning_(absl::StrCat(
        "descriptor sink: closing a descriptor from a peer has blocked for ",
        absl::FormatDuration(stalled), " (", sink_.backlog(),
        " waiting; kvtier_channel_sink_stalled_seconds); the channel keeps serving, and stops "
        "taking connections once ",
        limits_.sink.capacity, " wait"));
  } else if (sink_warned_ && stalled == absl::ZeroDuration()) {
    sink_warned_ = false;
    log_warning_("descriptor sink: closing again");
  }
}

void ChannelServer::WatchListener(bool on) {
  if (on == listening_) return;
  listening_ = on;
  if (on) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener_.get();
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev);
  } else {
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
  }
  if (metrics_ != nullptr) metrics_->SetChannelAcceptPaused(!on);
}

void ChannelServer::Count(Metrics::ConnectionDrop reason) {
  if (metrics_ != nullptr) metrics_->CountDroppedConnection(reason);
}

void ChannelServer::Gauge() {
  if (metrics_ != nullptr) metrics_->SetChannelConnections(pending_.size());
}

}  // namespace kvtier::daemon
