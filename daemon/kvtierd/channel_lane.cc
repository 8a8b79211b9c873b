#include "daemon/kvtierd/channel_lane.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edge/message_limits.h"

namespace kvtier::daemon {
namespace {

// Sends without waiting: a peer whose queue is full has stopped reading and is dropped.
bool SendNow(int fd, const v1::ChannelReply& reply) {
  return edge::SendMessage(fd, reply, {}).ok();
}

int64_t ThreadCpuMicros() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000 + t.tv_nsec / 1000;
}

}  // namespace

bool PriorityValve::Count(absl::Time now, int64_t cost) {
  if (now - window_start_ >= window_) {
    // The window that ended decides the next one; a whole window with no work is quiet.
    allowed_ = count_ <= max_per_window_ || now - window_start_ >= 2 * window_;
    window_start_ = now;
    count_ = 0;
  }
  count_ += cost;
  if (count_ > max_per_window_) allowed_ = false;
  return allowed_;
}

ChannelLane::ChannelLane(Lane lane, DaemonCore* core, DescriptorSink* sink,
                         ChannelLaneOptions options, LogFn log_info, LogFn log_warning)
    : lane_(lane),
      name_(lane == Lane::kHeartbeat ? "heartbeat lane" : "snapshot lane"),
      core_(core),
      sink_(sink),
      options_(options),
      log_info_(std::move(log_info)),
      log_warning_(std::move(log_warning)),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      valve_(lane == Lane::kHeartbeat ? kMaxLaneBeatsPerSecond
                                      : static_cast<int64_t>(kSnapshotCpuShare * 1e6)) {
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
    // Set before the thread can read them: it does only after a request.
    granted_ = err == 0;
    SetRealtime(granted_);
    log_info_(err == 0 ? absl::StrCat(name_, ": SCHED_FIFO priority ", options_.realtime_priority)
                       : absl::StrCat(name_, ": SCHED_FIFO priority ", options_.realtime_priority,
                                      " refused (", std::strerror(err),
                                      "; systemd: LimitRTPRIO=); it runs at the default policy"));
  }
}

ChannelLane::~ChannelLane() {
  if (wake_write_.valid()) (void)!write(wake_write_.get(), "x", 1);
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [fd, c] : connections_) sink_->Close(std::move(c->fd));
  connections_.clear();
}

void ChannelLane::Adopt(edge::UniqueFd connection, const edge::PeerCredentials& peer,
                        const v1::ChannelRequest& first) {
  if (!Keep(connection, peer, first)) sink_->Close(std::move(connection));
}

bool ChannelLane::Keep(edge::UniqueFd& connection, const edge::PeerCredentials& peer,
                       const v1::ChannelRequest& first) {
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      const std::string why = absl::StrCat("the daemon keeps ", options_.max_connections, " ",
                                           name_, " connections already; use gRPC");
      (void)SendNow(
          connection.get(),
          edge::ChannelErrorReply(lane_ == Lane::kHeartbeat ? absl::ResourceExhaustedError(why)
                                                            : absl::UnavailableError(why)));
      CountDrop(PeerFault::kLaneFull);
      return false;
    }
  }
  if (!Answer(connection.get(), peer, first)) return false;  // kept once the core accepted one
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
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      connection = std::move(c->fd);
      return false;
    }
    connections_.emplace(fd, std::move(c));
    kept = connections_.size();
    GaugeConnectionsLocked();
  }
  log_info_(absl::StrCat(name_, ": keeps a connection of pid ", peer.pid, " (uid ", peer.uid, "; ",
                         kept, " kept)"));
  return true;
}

absl::StatusOr<v1::ChannelReply> ChannelLane::Ask(const edge::PeerCredentials& peer,
                                                  const v1::ChannelRequest& request) {
  if (lane_ == Lane::kHeartbeat) return core_->ChannelHeartbeat(peer, request.heartbeat());
  absl::StatusOr<v1::ChannelReply> reply = core_->ChannelSnapshot(peer, request.snapshot());
  if (!reply.ok()) return reply;
  if (const size_t bytes = reply->ByteSizeLong(); bytes > edge::kMaxChannelMessageBytes) {
    // The plan is in flight now; the same snapshot over gRPC gets it (a resubmission's answer).
    return absl::UnavailableError(absl::StrCat("the plan's ", bytes, " bytes exceed the channel's ",
                                               edge::kMaxChannelMessageBytes,
                                               "; resend over gRPC"));
  }
  return reply;
}

bool ChannelLane::Answer(int fd, const edge::PeerCredentials& peer,
                         const v1::ChannelRequest& request) {
  absl::StatusOr<v1::ChannelReply> reply = Ask(peer, request);
  if (!reply.ok()) {
    // A refused request ends the connection: a lost lease or a restarted daemon (the worker
    // registers again and connects anew), a session it may not speak for, a bad snapshot.
    (void)SendNow(fd, edge::ChannelErrorReply(reply.status()));
    // A health probe's heartbeat (worker 0, never issued) is no peer's fault.
    const bool probe = lane_ == Lane::kHeartbeat && request.heartbeat().worker_id() == 0;
    if (!probe) CountDrop(PeerFault::kRefused);
    if (reply.status().code() == absl::StatusCode::kPermissionDenied) {
      log_warning_(absl::StrCat(name_, ": pid ", peer.pid, ": ", reply.status().message()));
    }
    return false;
  }
  if (SendNow(fd, *reply)) return true;
  CountDrop(PeerFault::kUnread);
  log_warning_(absl::StrCat(name_, ": dropped pid ", peer.pid,
                            ": its answer could not be sent (left unread, or the connection "
                            "closed)"));
  return false;
}

void ChannelLane::Loop() {
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

bool ChannelLane::Serve(Connection& c) {
  v1::ChannelRequest request;
  std::vector<edge::UniqueFd> attached;
  absl::Status sent = edge::ReceiveWithDescriptors(c.fd.get(), &request, &attached);
  const bool heartbeats = lane_ == Lane::kHeartbeat;
  if (!attached.empty()) {
    // Never closed here: their close could block on what the peer made of them.
    const size_t n = attached.size();
    sink_->Close(std::move(attached));
    (void)SendNow(c.fd.get(),
                  edge::ChannelErrorReply(absl::InvalidArgumentError(absl::StrCat(
                      "a ", heartbeats ? "heartbeat" : "snapshot",
                      " on the memory channel carries no descriptors; ", n, " came attached"))));
    log_warning_(absl::StrCat(name_, ": dropped pid ", c.peer.pid, " (uid ", c.peer.uid,
                              "): it attached ", n, " descriptors to a request"));
    CountDrop(PeerFault::kDescriptors);
    return false;
  }
  if (!sent.ok()) {
    // Woken with nothing to read: keep it. Closed, or a datagram that is no request: drop it.
    return sent.code() == absl::StatusCode::kDeadlineExceeded;
  }
  if (request.op_case() !=
      (heartbeats ? v1::ChannelRequest::kHeartbeat : v1::ChannelRequest::kSnapshot)) {
    (void)SendNow(c.fd.get(), edge::ChannelErrorReply(absl::InvalidArgumentError(
                                  absl::StrCat("a kept channel connection carries ",
                                               heartbeats ? "heartbeats" : "snapshots", " only"))));
    CountDrop(PeerFault::kMisuse);
    return false;
  }
  const absl::Time now = absl::Now();
  if (heartbeats) {
    if (!WithinRate(c, now)) return false;
    Throttle(now, 1);
    return Answer(c.fd.get(), c.peer, request);
  }
  const int64_t cpu = ThreadCpuMicros();
  const bool kept = Answer(c.fd.get(), c.peer, request);
  Throttle(now, ThreadCpuMicros() - cpu);
  return kept;
}

bool ChannelLane::WithinRate(Connection& c, absl::Time now) {
  c.tokens = std::min<double>(
      kBurst, c.tokens + absl::ToDoubleSeconds(now - c.refilled) * kMaxBeatsPerSecond);
  c.refilled = now;
  if (c.tokens >= 1) {
    c.tokens -= 1;
    return true;
  }
  (void)SendNow(c.fd.get(), edge::ChannelErrorReply(absl::ResourceExhaustedError(absl::StrCat(
                                "heartbeats faster than ", kMaxBeatsPerSecond, " a second"))));
  log_warning_(absl::StrCat(name_, ": dropped pid ", c.peer.pid, ": too many heartbeats"));
  CountDrop(PeerFault::kTooFast);
  return false;
}

void ChannelLane::Throttle(absl::Time now, int64_t cost) {
  if (!granted_) return;  // never real-time: nothing to give up, and no call to repeat
  const bool allowed = valve_.Count(now, cost);
  if (allowed == realtime_) return;
  sched_param param{};
  param.sched_priority = allowed ? options_.realtime_priority : 0;
  if (pthread_setschedparam(pthread_self(), allowed ? SCHED_FIFO : SCHED_OTHER, &param) != 0) {
    return;
  }
  SetRealtime(allowed);
  log_warning_(allowed ? absl::StrCat(name_, ": back to SCHED_FIFO (under the cap again)")
               : lane_ == Lane::kHeartbeat
                   ? absl::StrCat(name_, ": over ", kMaxLaneBeatsPerSecond,
                                  " heartbeats a second from all connections together; "
                                  "SCHED_FIFO given up until they slow down")
                   : absl::StrCat(name_, ": snapshots took over ", kSnapshotCpuShare * 100,
                                  "% of a core; SCHED_FIFO given up until they take less"));
}

void ChannelLane::Drop(int fd) {
  std::unique_ptr<Connection> gone;
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  gone = std::move(it->second);
  connections_.erase(it);
  GaugeConnectionsLocked();
  sink_->Close(std::move(gone->fd));
}

void ChannelLane::CountDrop(PeerFault fault) {
  using D = Metrics::ConnectionDrop;
  // Per lane (heartbeat, snapshot), in PeerFault's order. Snapshot connections have no rate,
  // so the snapshot lane never counts kTooFast.
  static constexpr D kReasons[2][6] = {
      {D::kHeartbeatUnread, D::kHeartbeatTooFast, D::kHeartbeatRefused, D::kHeartbeatMisuse,
       D::kHeartbeatLaneFull, D::kChannelDescriptors},
      {D::kSnapshotUnread, D::kHeartbeatTooFast, D::kSnapshotRefused, D::kSnapshotMisuse,
       D::kSnapshotLaneFull, D::kChannelDescriptors}};
  if (options_.metrics == nullptr) return;
  options_.metrics->CountDroppedConnection(
      kReasons[static_cast<int>(lane_)][static_cast<int>(fault)]);
}

void ChannelLane::GaugeConnectionsLocked() {
  if (options_.metrics != nullptr) options_.metrics->SetLaneConnections(lane_, connections_.size());
}

void ChannelLane::SetRealtime(bool realtime) {
  realtime_ = realtime;
  if (options_.metrics != nullptr) options_.metrics->SetLaneRealtime(lane_, realtime);
}

}  // namespace kvtier::daemon
