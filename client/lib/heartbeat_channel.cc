#include "client/lib/heartbeat_channel.h"

namespace kvtier::internal {

std::optional<absl::Status> HeartbeatChannel::Beat(const v1::HeartbeatRequest& request,
                                                   v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  if (declined_) return std::nullopt;
  if (!fd_.valid()) {
    absl::StatusOr<edge::UniqueFd> fd = edge::ConnectChannel(channel_path_, timeout_);
    if (!fd.ok()) return fd.status();
    fd_ = *std::move(fd);
  }
  v1::ChannelRequest wrapped;
  *wrapped.mutable_heartbeat() = request;
  v1::ChannelReply reply;
  absl::Status sent = edge::SendMessage(fd_.get(), wrapped, {});
  absl::StatusOr<std::vector<edge::UniqueFd>> received =
      sent.ok() ? edge::ReceiveMessage(fd_.get(), &reply) : sent;
  if (!received.ok()) {
    // A late answer would pair with the next request: start afresh. The daemon gone (a closed
    // connection, a refused send) reads as UNAVAILABLE, as it does over gRPC.
    fd_.Reset();
    const absl::StatusCode code = received.status().code();
    return code == absl::StatusCode::kDeadlineExceeded
               ? received.status()
               : absl::UnavailableError(received.status().message());
  }
  if (reply.code() == 0 && reply.has_heartbeat()) {
    *response = reply.heartbeat();
    return absl::OkStatus();
  }
  const auto code = static_cast<absl::StatusCode>(reply.code());
  // An older daemon (INVALID_ARGUMENT: no such operation) or a full lane: gRPC it is.
  if (reply.code() == 0 || code == absl::StatusCode::kInvalidArgument ||
      code == absl::StatusCode::kResourceExhausted) {
    fd_.Reset();
    declined_ = code != absl::StatusCode::kResourceExhausted;
    return std::nullopt;
  }
  // The daemon closes the connection after any heartbeat it refused.
  fd_.Reset();
  return absl::Status(reply.code() > 0 && reply.code() <= 16 ? code : absl::StatusCode::kInternal,
                      reply.message());
}

void HeartbeatChannel::Retry() {
  absl::MutexLock lock(&mu_);
  declined_ = false;
}

}  // namespace kvtier::internal
