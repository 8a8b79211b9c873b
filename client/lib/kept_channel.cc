#include "client/lib/kept_channel.h"

#include "edge/message_limits.h"

namespace kvtier::internal {
namespace {

absl::Status StatusOf(const v1::ChannelReply& reply) {
  const int code = reply.code();
  return absl::Status(
      code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal,
      reply.message());
}

}  // namespace

std::optional<absl::StatusOr<v1::ChannelReply>> KeptChannel::Exchange(
    const v1::ChannelRequest& request) {
  edge::UniqueFd fd;
  {
    absl::MutexLock lock(&mu_);
    if (declined_) return std::nullopt;
    if (!idle_.empty()) {
      fd = std::move(idle_.back());
      idle_.pop_back();
    } else if (open_ < max_connections_) {
      ++open_;  // connected below, without the lock
    } else {
      return std::nullopt;
    }
  }
  if (!fd.valid()) {
    absl::StatusOr<edge::UniqueFd> connected =
        edge::ConnectChannel(channel_path_, timeout_, &daemon_);
    if (!connected.ok()) {
      Return(edge::UniqueFd(), false);
      return connected.status();
    }
    fd = *std::move(connected);
  }
  v1::ChannelReply reply;
  absl::Status sent = edge::SendMessage(fd.get(), request, {});
  absl::StatusOr<std::vector<edge::UniqueFd>> received =
      sent.ok() ? edge::ReceiveMessage(fd.get(), &reply) : sent;
  if (!received.ok()) {
    // A late answer would pair with the next request: start afresh. The daemon gone (a closed
    // connection, a refused send) reads as UNAVAILABLE, as it does over gRPC.
    Return(std::move(fd), false);
    const absl::StatusCode code = received.status().code();
    return code == absl::StatusCode::kDeadlineExceeded
               ? received.status()
               : absl::UnavailableError(received.status().message());
  }
  Return(std::move(fd), reply.code() == 0);  // the daemon closes it after a refusal
  return reply;
}

void KeptChannel::Return(edge::UniqueFd fd, bool keep) {
  absl::MutexLock lock(&mu_);
  if (keep && !declined_) {
    idle_.push_back(std::move(fd));
  } else {
    --open_;
  }
}

void KeptChannel::Decline() {
  absl::MutexLock lock(&mu_);
  open_ -= static_cast<int>(idle_.size());
  idle_.clear();
  declined_ = true;
}

void KeptChannel::Retry() {
  absl::MutexLock lock(&mu_);
  declined_ = false;
}

std::optional<absl::Status> ChannelHeartbeat(KeptChannel& channel,
                                             const v1::HeartbeatRequest& request,
                                             v1::HeartbeatResponse* response) {
  v1::ChannelRequest wrapped;
  *wrapped.mutable_heartbeat() = request;
  std::optional<absl::StatusOr<v1::ChannelReply>> reply = channel.Exchange(wrapped);
  if (!reply) return std::nullopt;
  // No answer in time, or none at all (a wedged or absent lane): this beat goes over gRPC, so the
  // lease does not lapse while gRPC works. The next beat tries the channel again, anew.
  if (!reply->ok()) return std::nullopt;
  if ((*reply)->code() == 0 && (*reply)->has_heartbeat()) {
    *response = (*reply)->heartbeat();
    return absl::OkStatus();
  }
  const auto code = static_cast<absl::StatusCode>((*reply)->code());
  // An older daemon (INVALID_ARGUMENT: no such operation): gRPC until the next session. A full
  // lane: gRPC this time.
  if ((*reply)->code() == 0 || code == absl::StatusCode::kInvalidArgument) {
    channel.Decline();
    return std::nullopt;
  }
  if (code == absl::StatusCode::kResourceExhausted) return std::nullopt;
  return StatusOf(**reply);
}

std::optional<absl::Status> ChannelSnapshot(KeptChannel& channel,
                                            const v1::SubmitSnapshotRequest& snapshot,
                                            v1::TierPlan* plan) {
  // The request wraps the snapshot in a few bytes of its own.
  if (snapshot.ByteSizeLong() + 16 > edge::kMaxChannelMessageBytes) return std::nullopt;
  v1::ChannelRequest wrapped;
  *wrapped.mutable_snapshot() = snapshot;
  std::optional<absl::StatusOr<v1::ChannelReply>> reply = channel.Exchange(wrapped);
  if (!reply) return std::nullopt;
  if (!reply->ok()) {
    // A daemon that did not answer in time would not over gRPC either; one whose channel is
    // gone may still answer there.
    if (reply->status().code() == absl::StatusCode::kDeadlineExceeded) return reply->status();
    return std::nullopt;
  }
  if ((*reply)->code() == 0) {
    if (!(*reply)->has_plan()) return std::nullopt;
    *plan = std::move(*(*reply)->mutable_plan());
    return absl::OkStatus();
  }
  if ((*reply)->code() == static_cast<int>(absl::StatusCode::kUnavailable)) return std::nullopt;
  return StatusOf(**reply);
}

}  // namespace kvtier::internal
