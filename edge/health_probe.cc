#include "edge/health_probe.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::edge {
namespace {

// The daemon's reply to `request` on a new channel connection, whatever its code; a transport
// failure (nothing there, nothing in time) as a status. The whole exchange ends within
// `timeout`: the socket's own timeouts bound each step, poll() the wait for the reply.
absl::StatusOr<v1::ChannelReply> Ask(const std::string& path, const v1::ChannelRequest& request,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Never zero: a socket timeout of zero blocks for ever.
  absl::StatusOr<UniqueFd> sock =
      ConnectChannel(path, std::max(absl::Milliseconds(1), deadline - absl::Now()));
  if (!sock.ok()) return sock.status();
  if (absl::Status s = SendMessage(sock->get(), request, {}); !s.ok()) return s;
  pollfd p{sock->get(), POLLIN, 0};
  const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
  const int ready = poll(&p, 1, static_cast<int>(wait_ms));
  if (ready == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("no answer on ", path, " within ", absl::FormatDuration(timeout),
                     " (the channel's threads are wedged, or something else serves the path)"));
  }
  if (ready < 0) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  v1::ChannelReply reply;
  absl::StatusOr<std::vector<UniqueFd>> fds = ReceiveMessage(sock->get(), &reply);
  if (!fds.ok()) return fds.status();
  return reply;
}

std::string Answered(const v1::ChannelReply& reply) {
  if (reply.code() == 0) return "answered OK";
  const int code = reply.code() > 0 && reply.code() <= 16 ? reply.code() : 2;  // UNKNOWN
  return absl::StrCat("answered ", absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                      ": ", reply.message());
}

using Check = std::function<absl::Status(absl::Duration timeout, std::string* detail)>;

HealthCheck Timed(const char* name, absl::Duration timeout, const Check& check) {
  HealthCheck c;
  c.name = name;
  const absl::Time start = absl::Now();
  c.status = check(timeout, &c.detail);
  c.latency = absl::Now() - start;
  if (!c.status.ok() && c.detail.empty()) c.detail = std::string(c.status.message());
  return c;
}

absl::Status Hello(const std::string& channel, absl::Duration timeout, std::string* detail) {
  v1::ChannelRequest request;
  request.mutable_hello();
  absl::StatusOr<v1::ChannelReply> reply = Ask(channel, request, timeout);
  if (!reply.ok()) return reply.status();
  *detail = reply->code() == 0 ? absl::StrCat("uid ", reply->peer_uid(),
                                              reply->operator_() ? ", operator" : "", ": a ticket")
                               : Answered(*reply);
  return absl::OkStatus();
}

absl::Status Heartbeat(const std::string& channel, absl::Duration timeout, std::string* detail) {
  v1::ChannelRequest request;
  // Worker 0 is never issued: refused, nothing renewed, nobody's error.
  request.mutable_heartbeat()->set_worker_id(0);
  absl::StatusOr<v1::ChannelReply> reply = Ask(channel, request, timeout);
  if (!reply.ok()) return reply.status();
  *detail = reply->code() == static_cast<int>(absl::StatusCode::kFailedPrecondition)
                ? "refused a heartbeat for no session, as it should"
                : Answered(*reply);
  return absl::OkStatus();
}

absl::Status Grpc(const std::string& socket, absl::Duration timeout, std::string* detail) {
  grpc::ChannelArguments args;
  // A connection of its own: gRPC would otherwise share an open one between channels (inside
  // kvtierd, with nothing), and a listener deaf to new connections still serves an open one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::KvTier::NewStub(
      grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetStatusResponse response;
  grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("GetStatus on unix:", socket, " (deadline ",
                                     absl::FormatDuration(timeout), "): ", s.error_message()));
  }
  *detail = absl::StrCat("epoch ", response.daemon_epoch(), ", ", response.workers(), " workers, ",
                         response.sequences(), " sequences");
  return absl::OkStatus();
}

}  // namespace

bool HealthReport::ok() const {
  for (const HealthCheck& c : checks) {
    if (!c.status.ok()) return false;
  }
  return !checks.empty();
}

std::string HealthReport::FailedChecks() const {
  std::vector<std::string> names;
  for (const HealthCheck& c : checks) {
    if (!c.status.ok()) names.push_back(c.name);
  }
  return absl::StrJoin(names, ",");
}

HealthReport ProbeHealth(const HealthProbeOptions& options) {
  const std::string channel = ChannelPathFor(options.socket_path);
  const std::string& socket = options.socket_path;
  HealthReport report;
  report.checks.push_back(Timed(kCheckHello, options.timeout,
                                [&](auto t, std::string* d) { return Hello(channel, t, d); }));
  report.checks.push_back(Timed(kCheckHeartbeat, options.timeout,
                                [&](auto t, std::string* d) { return Heartbeat(channel, t, d); }));
  report.checks.push_back(Timed(kCheckGrpc, options.timeout,
                                [&](auto t, std::string* d) { return Grpc(socket, t, d); }));
  return report;
}

}  // namespace kvtier::edge
