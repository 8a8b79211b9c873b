#include "daemon/kvtierd/heartbeat_lane.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {
namespace {

// Sends without waiting: a peer whose queue is full has stopped reading and is dropped.
bool SendNow(int fd, const v1::ChannelReply& reply) {
  return edge::SendMessage(fd, reply, {}).ok();
}

}  // namespace

bool PriorityValve::Count(absl::Time now) {
  if (now - window_start_ >= window_) {
    // The window that ended decides the next one; a whole window with no heartbeat is quiet.
    allowed_ = count_ <= max_per_window_ || now - window_start_ >= 2 * window_;
    window_start_ = now;
    count_ = 0;
  }
  if (++count_ > max_per_window_) allowed_ = false;
  return allowed_;
}

HeartbeatLane::HeartbeatLane(DaemonCore* core, HeartbeatLaneOptions options, LogFn log_info,
                             LogFn log_warning)
    : core_(core),
      options_(options),
      log_info_(std::move(log_info)),
      log_warning_(std::move(log_warning)),
      epoll_(epoll_create1(EPOLL_CLOEXEC)) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == 0) {
    wake_read_.Reset(fds[0]);
    wake_write_.Reset(fds[1]);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_read_.get();
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_read_.get(), &ev);
  thread_ = std::thread([this] { Loop(); });
  if (options_.realtime_priority > 0) {
    sched_param param{};
    param.sched_priority = options_.realtime_priority;
    const int err = pthread_setschedparam(thread_.native_handle(), SCHED_FIFO, &param);
    // Set before the thread can read them: it does only after a heartbeat.
    granted_ = err == 0;
    SetRealtime(granted_);
    log_info_(err == 0
                  ? absl::StrCat("heartbeat lane: SCHED_FIFO priority ", options_.realtime_priority)
                  : absl::StrCat("heartbeat lane: SCHED_FIFO priority ", options_.realtime_priority,
                                 " refused (", std::strerror(err),
                                 "; systemd: LimitRTPRIO=); it runs at the default policy"));
  }
}

HeartbeatLane::~HeartbeatLane() {
  if (wake_write_.valid()) (void)!write(wake_write_.get(), "x", 1);
  thread_.join();
}

void HeartbeatLane::Adopt(edge::UniqueFd connection, const edge::PeerCredentials& peer,
                          const v1::HeartbeatRequest& first) {
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      (void)SendNow(connection.get(),
                    edge::ChannelErrorReply(absl::ResourceExhaustedError(
                        absl::StrCat("the daemon keeps ", options_.max_connections,
                                     " heartbeat connections already; heartbeat over gRPC"))));
      CountDrop(Metrics::ConnectionDrop::kHeartbeatLaneFull);
      return;
    }
  }
  if (!Answer(connection.get(), peer, first)) return;  // kept only once the core accepted one
  const int fd = connection.get();
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Connection>();
  c->fd = std::move(connection);
  c->peer = peer;
  c->refilled = absl::Now();
  size_t kept = 0;
  {
    absl::MutexLock lock(&mu_);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return;  // closes with `c`
    connections_.emplace(fd, std::move(c));
    kept = connections_.size();
    GaugeConnectionsLocked();
  }
  log_info_(absl::StrCat("heartbeat lane: keeps a connection of pid ", peer.pid, " (uid ", peer.uid,
                         "; ", kept, " kept)"));
}

bool HeartbeatLane::Answer(int fd, const edge::PeerCredentials& peer,
                           const v1::HeartbeatRequest& request) {
  absl::StatusOr<v1::ChannelReply> reply = core_->ChannelHeartbeat(peer, request);
  if (!reply.ok()) {
    // A refused heartbeat ends the connection: a lost lease or a restarted daemon (the worker
    // registers again and connects anew), or a session it may not speak for.
    (void)SendNow(fd, edge::ChannelErrorReply(reply.status()));
    CountDrop(Metrics::ConnectionDrop::kHeartbeatRefused);
    if (reply.status().code() == absl::StatusCode::kPermissionDenied) {
      log_warning_(absl::StrCat("heartbeat lane: pid ", peer.pid, ": ", reply.status().message()));
    }
    return false;
  }
  if (SendNow(fd, *reply)) return true;
  CountDrop(Metrics::ConnectionDrop::kHeartbeatUnread);
  log_warning_(
      absl::StrCat("heartbeat lane: dropped pid ", peer.pid,
                   ": its answer could not be sent (left unread, or the connection closed)"));
  return false;
}

void HeartbeatLane::Loop() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_.get(), events, 64, -1);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_read_.get()) return;
      Connection* c = nullptr;
      {
        absl::MutexLock lock(&mu_);
        auto it = connections_.find(fd);
        if (it != connections_.end()) c = it->second.get();
      }
      if (c != nullptr && !Serve(*c)) Drop(fd);
    }
  }
}

bool HeartbeatLane::Serve(Connection& c) {
  v1::ChannelRequest request;
  absl::StatusOr<std::vector<edge::UniqueFd>> sent = edge::ReceiveMessage(c.fd.get(), &request);
  if (!sent.ok()) {
    // Woken with nothing to read: keep it. Closed, or a datagram that is no request: drop it.
    return sent.status().code() == absl::StatusCode::kDeadlineExceeded;
  }
  if (request.op_case() != v1::ChannelRequest::kHeartbeat) {
    (void)SendNow(c.fd.get(), edge::ChannelErrorReply(absl::InvalidArgumentError(
                                  "a kept channel connection carries heartbeats only")));
    CountDrop(Metrics::ConnectionDrop::kHeartbeatMisuse);
    return false;
  }
  const absl::Time now = absl::Now();
  c.tokens = std::min<double>(
      kBurst, c.tokens + absl::ToDoubleSeconds(now - c.refilled) * kMaxBeatsPerSecond);
  c.refilled = now;
  if (c.tokens < 1) {
    (void)SendNow(c.fd.get(), edge::ChannelErrorReply(absl::ResourceExhaustedError(absl::StrCat(
                                  "heartbeats faster than ", kMaxBeatsPerSecond, " a second"))));
    log_warning_(absl::StrCat("heartbeat lane: dropped pid ", c.peer.pid, ": too many heartbeats"));
    CountDrop(Metrics::ConnectionDrop::kHeartbeatTooFast);
    return false;
  }
  c.tokens -= 1;
  Throttle(now);
  return Answer(c.fd.get(), c.peer, request.heartbeat());
}

void HeartbeatLane::Throttle(absl::Time now) {
  if (!granted_) return;  // never real-time: nothing to give up, and no call to repeat
  const bool allowed = valve_.Count(now);
  if (allowed == realtime_) return;
  sched_param param{};
  param.sched_priority = allowed ? options_.realtime_priority : 0;
  if (pthread_setschedparam(pthread_self(), allowed ? SCHED_FIFO : SCHED_OTHER, &param) != 0) {
    return;
  }
  SetRealtime(allowed);
  log_warning_(allowed ? "heartbeat lane: back to SCHED_FIFO (heartbeats under the cap again)"
                       : absl::StrCat("heartbeat lane: over ", kMaxLaneBeatsPerSecond,
                                      " heartbeats a second from all connections together; "
                                      "SCHED_FIFO given up until they slow down"));
}

void HeartbeatLane::Drop(int fd) {
  std::unique_ptr<Connection> gone;
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  gone = std::move(it->second);
  connections_.erase(it);
  GaugeConnectionsLocked();
}

void HeartbeatLane::CountDrop(Metrics::ConnectionDrop reason) {
  if (options_.metrics != nullptr) options_.metrics->CountDroppedConnection(reason);
}

void HeartbeatLane::GaugeConnectionsLocked() {
  if (options_.metrics != nullptr) {
    options_.metrics->SetHeartbeatLaneConnections(connections_.size());
  }
}

void HeartbeatLane::SetRealtime(bool realtime) {
  realtime_ = realtime;
  if (options_.metrics != nullptr) options_.metrics->SetHeartbeatLaneRealtime(realtime);
}

}  // namespace kvtier::daemon
