#include "daemon/kvtierd/channel_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "edge/peer_process.h"

namespace kvtier::daemon {
namespace {

constexpr absl::Duration kRequestTimeout = absl::Milliseconds(500);

}  // namespace

ChannelServer::ChannelServer(edge::UniqueFd listener, DaemonCore* core,
                             ChannelLaneOptions heartbeats, ChannelLaneOptions snapshots,
                             LogFn log_info, LogFn log_warning, LogFn log_debug)
    : listener_(std::move(listener)),
      core_(core),
      log_debug_(std::move(log_debug)),
      heartbeats_(ChannelLane::Lane::kHeartbeat, core, heartbeats, log_info, log_warning),
      snapshots_(ChannelLane::Lane::kSnapshot, core, snapshots, log_info, log_warning) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == 0) {
    wake_read_.Reset(fds[0]);
    wake_write_.Reset(fds[1]);
  }
  // The listener is non-blocking: threads woken together race for a connection, and the
  // losers go back to poll() instead of blocking in accept().
  fcntl(listener_.get(), F_SETFL, fcntl(listener_.get(), F_GETFL) | O_NONBLOCK);
  for (int i = 0; i < kThreads; ++i) threads_.emplace_back([this] { Loop(); });
}

ChannelServer::~ChannelServer() {
  // The pipe stays readable once written, so it wakes every thread.
  if (wake_write_.valid()) (void)!write(wake_write_.get(), "x", 1);
  for (std::thread& t : threads_) t.join();
}

void ChannelServer::Loop() {
  for (;;) {
    pollfd p[2] = {{listener_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    edge::UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    timeval tv = absl::ToTimeval(kRequestTimeout);
    setsockopt(connection.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(connection.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    Serve(std::move(connection));
  }
}

void ChannelServer::Serve(edge::UniqueFd owned) {
  const int connection = owned.get();
  absl::StatusOr<edge::PeerCredentials> peer = edge::PeerOf(connection);
  v1::ChannelRequest request;
  absl::StatusOr<std::vector<edge::UniqueFd>> sent_fds = edge::ReceiveMessage(connection, &request);
  // Hellos and fetches name the process (a pidfd): tickets are budgeted per process, and pool
  // memory stays charged until the process that received it exits. Without a pidfd the core
  // refuses extents (and budgets tickets by uid).
  if (peer.ok() && (request.has_hello() || request.has_fetch_extents())) {
    auto process = edge::PeerProcess::OfSocket(connection, peer->pid);
    if (process.ok()) peer->process = *std::move(process);
  }
  if (!peer.ok() || !sent_fds.ok()) {
    const absl::Status& s = !peer.ok() ? peer.status() : sent_fds.status();
    log_debug_(absl::StrCat("memory channel: dropped a request: ", s.message()));
    (void)edge::SendMessage(connection, edge::ChannelErrorReply(s), {});
    return;
  }
  // Descriptors a caller sent are never used: they close with sent_fds.
  std::vector<edge::UniqueFd> fds;
  absl::StatusOr<v1::ChannelReply> reply;
  switch (request.op_case()) {
    case v1::ChannelRequest::kHello:
      reply = core_->Hello(*peer);
      if (reply.ok()) reply->set_takes_snapshots(true);
      break;
    case v1::ChannelRequest::kFetchExtents:
      reply = core_->FetchExtents(*peer, request.fetch_extents(), &fds);
      break;
    case v1::ChannelRequest::kHeartbeat:
      heartbeats_.Adopt(std::move(owned), *peer, request);
      return;
    case v1::ChannelRequest::kSnapshot:
      snapshots_.Adopt(std::move(owned), *peer, request);
      return;
    default:
      reply = absl::InvalidArgumentError(
          "channel request names no operation (hello, fetch_extents, heartbeat or snapshot)");
  }
  if (!reply.ok()) {
    log_debug_(absl::StrCat("memory channel: uid ", peer->uid, " pid ", peer->pid, ": ",
                            reply.status().message()));
    (void)edge::SendMessage(connection, edge::ChannelErrorReply(reply.status()), {});
    return;
  }
  std::vector<int> raw;
  raw.reserve(fds.size());
  for (const edge::UniqueFd& fd : fds) raw.push_back(fd.get());
  absl::Status s = edge::SendMessage(connection, *reply, raw);
  if (!s.ok()) log_debug_(absl::StrCat("memory channel: reply not sent: ", s.message()));
}

}  // namespace kvtier::daemon
