// kvtierctl: the operator's view of a running kvtierd.

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/kvtierctl/plan_command.h"
#include "client/kvtierctl/status_view.h"
#include "client/kvtierctl/table.h"
#include "client/kvtierctl/top_command.h"
#include "edge/daemon_socket.h"
#include "edge/health_probe.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::ctl {
namespace {

const char* PoolName(v1::PoolKind kind) {
  switch (kind) {
    case v1::POOL_KIND_DDR:
      return "ddr (T1)";
    case v1::POOL_KIND_COMPRESSED:
      return "compressed (T2)";
    default:
      return "?";
  }
}

std::string Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * part / whole);
}

std::string StatusTable(const v1::GetStatusResponse& s) {
  Table t({"FIELD", "VALUE"}, /*align_numbers=*/false);
  t.AddRow({"version", s.version()});
  t.AddRow({"epoch", absl::StrCat(s.daemon_epoch())});
  t.AddRow({"uptime", HumanDuration(s.uptime_ms())});
  t.AddRow({"listening", s.listen_address()});
  t.AddRow({"metrics", s.metrics_address().empty() ? "off" : s.metrics_address()});
  t.AddRow({"workers", absl::StrCat(s.workers())});
  t.AddRow({"sequences", absl::StrCat(s.sequences())});
  t.AddRow({"HBM saved", HumanBytes(s.hbm_saved_bytes())});
  for (const auto& p : s.pools()) {
    t.AddRow({absl::StrCat("pool ", PoolName(p.kind())),
              absl::StrCat(HumanBytes(p.used_bytes()), " / ", HumanBytes(p.capacity_bytes()), " (",
                           Percent(p.used_bytes(), p.capacity_bytes()), ")",
                           // Ended sessions' extents a live process still maps: charged.
                           p.draining_bytes() == 0
                               ? ""
                               : absl::StrCat("; draining ", HumanBytes(p.draining_bytes()),
                                              " (held by processes of ended sessions)"))});
  }
  return t.Render();
}

std::string PoolsTable(const v1::GetStatusResponse& s) {
  Table t({"POOL", "MEMORY", "CAPACITY", "USED", "USE%", "SLOTS"});
  for (const auto& p : s.pools()) {
    t.AddRow({PoolName(p.kind()), p.shm_name(), HumanBytes(p.capacity_bytes()),
              HumanBytes(p.used_bytes()), Percent(p.used_bytes(), p.capacity_bytes()),
              absl::StrCat(p.slots_used())});
  }
  return t.Render();
}

std::string WorkersTable(const v1::GetStatusResponse& s) {
  Table t({"ID", "NAME", "PID", "UID", "MODEL", "SEQS", "DDR", "COMPRESSED", "LEASE LEFT"});
  for (const auto& w : s.worker_list()) {
    t.AddRow({absl::StrCat(w.worker_id()), w.worker_name(), absl::StrCat(w.pid()),
              absl::StrCat(w.uid()), w.model_name(), absl::StrCat(w.sequences()),
              HumanBytes(w.ddr_bytes()), HumanBytes(w.compressed_bytes()),
              HumanDuration(w.lease_remaining_ms())});
  }
  return t.Render();
}

std::string SequencesTable(const v1::GetStatusResponse& s) {
  Table t({"ID", "WORKER", "TAG", "POLICY", "TOKENS", "T0", "T1", "T2", "EVICTED", "EVICT%GEN",
           "T0 BYTES", "FULL BYTES", "PLAN"});
  for (const auto& q : s.sequence_list()) {
    const auto& r = q.report();
    t.AddRow({absl::StrCat(q.sequence_id()), absl::StrCat(q.worker_id()), q.tag(), q.policy(),
              absl::StrCat(q.length()), absl::StrCat(r.tokens_t0()), absl::StrCat(r.tokens_t1()),
              absl::StrCat(r.tokens_t2()), absl::StrCat(r.tokens_t3()),
              absl::StrFormat("%.2f%%", 100 * r.evicted_fraction_generated()),
              HumanBytes(r.t0_bytes()), HumanBytes(r.full_bytes()),
              absl::StrCat(q.plan_version())});
  }
  return t.Render();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// `kvtierctl health`: the probe a worker's view needs (edge/health_probe.h), one line per check;
// exit 0 when every check passed, 1 naming the failed ones otherwise.
int Health(const edge::SocketChoice& choice, double timeout_s, bool json) {
  const std::string& socket = choice.path;
  edge::HealthReport report = edge::ProbeHealth(
      {.socket_path = socket, .timeout = absl::Seconds(std::max(0.001, timeout_s))});
  if (json) {
    std::string out =
        absl::StrCat("{\n  \"healthy\": ", report.ok() ? "true" : "false",
                     ",\n  \"socket\": ", JsonString(socket),
                     ",\n  \"failed\": ", JsonString(report.FailedChecks()), ",\n  \"checks\": [");
    for (size_t i = 0; i < report.checks.size(); ++i) {
      const edge::HealthCheck& c = report.checks[i];
      absl::StrAppend(
          &out, i ? "," : "", "\n    {\"name\": ", JsonString(c.name),
          ", \"ok\": ", c.status.ok() ? "true" : "false",
          ", \"code\": ", JsonString(absl::StatusCodeToString(c.status.code())),
          absl::StrFormat(", \"latency_ms\": %.3f", absl::ToDoubleMilliseconds(c.latency)),
          ", \"detail\": ", JsonString(c.detail), "}");
    }
    absl::StrAppend(&out, "\n  ]\n}\n");
    std::fputs(out.c_str(), stdout);
  } else {
    for (const edge::HealthCheck& c : report.checks) {
      std::printf(
          "%-4s %-18s %9.3f ms  %s\n", c.status.ok() ? "ok" : "FAIL", c.name.c_str(),
          absl::ToDoubleMilliseconds(c.latency),
          c.status.ok()
              ? c.detail.c_str()
              : absl::StrCat(absl::StatusCodeToString(c.status.code()), ": ", c.detail).c_str());
    }
  }
  if (report.ok()) return 0;
  const std::string problem = edge::SocketProblem(socket);
  std::fprintf(stderr, "kvtierctl: kvtierd at %s is unhealthy: %s failed%s\n",
               choice.Describe().c_str(), report.FailedChecks().c_str(),
               problem.empty() ? "" : absl::StrCat(" (", problem, ")").c_str());
  return 1;
}

// The ticket that lets GetStatus list every worker and sequence: the memory channel beside the
// unix socket checks our uid against security.operator_uids. Empty, with `note` saying why, when
// it does not (or over TCP, where the daemon cannot tell who asks).
std::string OperatorTicket(const std::string& socket, bool tcp, std::string* note) {
  if (tcp) {
    *note = "over TCP the daemon cannot tell who asks";
    return "";
  }
  v1::ChannelRequest hello;
  hello.mutable_hello();
  absl::StatusOr<v1::ChannelReply> ticket =
      edge::ChannelCall(edge::ChannelPathFor(socket), hello, nullptr);
  if (ticket.ok() && ticket->operator_()) return ticket->ticket();
  *note = ticket.ok()
              ? absl::StrCat("uid ", ticket->peer_uid(),
                             " is not in security.operator_uids; to grant it, "
                             "add `[security] operator_uids = [",
                             ticket->peer_uid(), "]` to kvtierd's config and send it SIGHUP")
              : std::string(ticket.status().message());
  return "";
}

// `kvtierctl top`'s source: one GetStatus with every list per frame.
TopSource TopFrom(const std::string& socket, const std::string& address, int timeout_ms) {
  const std::string target = address.empty() ? "unix:" + socket : address;
  auto stub = std::shared_ptr<v1::KvTier::Stub>(
      v1::KvTier::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())));
  return [=]() -> absl::StatusOr<TopFetch> {
    TopFetch got;
    v1::GetStatusRequest request;
    request.set_include_workers(true);
    request.set_include_sequences(true);
    request.set_operator_ticket(OperatorTicket(socket, !address.empty(), &got.note));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    grpc::Status status = stub->GetStatus(&ctx, request, &got.status);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach kvtierd at ", target, ": ", status.error_message()));
    }
    return got;
  };
}

}  // namespace
}  // namespace kvtier::ctl

int main(int argc, char** argv) {
  using namespace kvtier;
  CLI::App app{"kvtierctl: inspect a running kvtierd."};
  std::optional<std::string> socket_flag;
  std::string address;
  bool json = false;
  int timeout_ms = 3000;
  app.add_option("--socket", socket_flag,
                 absl::StrCat("kvtierd's unix socket (default: $", edge::kSocketEnv,
                              " if set, else ", edge::kDefaultSocketPath, ")"));
  app.add_option("--address", address, "Connect to a gRPC address instead (e.g. 127.0.0.1:50551)");
  app.add_flag("--json", json, "Print the daemon's answer as JSON, for scripts");
  app.add_option("--timeout-ms", timeout_ms, "Give up after this long")->capture_default_str();
  app.require_subcommand(1, 1);
  // `kvtierctl health --json` as well as `kvtierctl --json health` (subcommands inherit it).
  app.fallthrough();
  app.add_subcommand("status", "Daemon, pools and HBM saved");
  app.add_subcommand("workers", "Registered workers and their leases");
  app.add_subcommand("sequences", "Open sequences and where their tokens live");
  app.add_subcommand("pools", "Shared-memory pools: capacity and use");
  double health_timeout_s = 2.0;
  app.add_subcommand("health",
                     "Does kvtierd serve workers? A hello and a heartbeat on the memory channel "
                     "and a gRPC call, each with its own deadline; exit 1 names what failed")
      ->add_option("--timeout", health_timeout_s, "Seconds each check may take")
      ->capture_default_str();
  ctl::PlanArgs plan_args;
  CLI::App* plan = ctl::AddPlanCommand(app, &plan_args);
  ctl::TopArgs top_args;
  CLI::App* top = ctl::AddTopCommand(app, &top_args);
  CLI11_PARSE(app, argc, argv);
  if (plan->parsed()) {
    plan_args.json |= json;
    return ctl::RunPlan(plan_args);
  }
  const edge::SocketChoice socket_choice = edge::ChooseSocket(socket_flag);
  const std::string& socket = socket_choice.path;
  if (top->parsed()) {
    top_args.json |= json;
    return ctl::RunTop(top_args, ctl::TopFrom(socket, address, timeout_ms));
  }
  const std::string command = app.get_subcommands()[0]->get_name();
  if (command == "health") {
    if (!address.empty()) {
      std::fprintf(stderr,
                   "kvtierctl: health needs the unix socket (--socket): the memory channel is "
                   "beside it, and a worker uses both\n");
      return 2;
    }
    return ctl::Health(socket_choice, health_timeout_s, json);
  }

  const std::string target = address.empty() ? "unix:" + socket : address;
  auto stub = v1::KvTier::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  v1::GetStatusRequest request;
  request.set_include_workers(command == "workers");
  request.set_include_sequences(command == "sequences");
  // Lists of workers and sequences are for operators: the memory channel beside the unix
  // socket checks our uid against security.operator_uids and hands out a ticket that says so.
  std::string view_note;
  if (command == "workers" || command == "sequences") {
    request.set_operator_ticket(ctl::OperatorTicket(socket, !address.empty(), &view_note));
  }
  v1::GetStatusResponse response;
  grpc::Status status = stub->GetStatus(&ctx, request, &response);
  if (!status.ok()) {
    // Over the socket, say which path was tried, where it came from and what is wrong with it.
    const std::string problem = address.empty() ? edge::SocketProblem(socket) : "";
    std::fprintf(
        stderr, "kvtierctl: cannot reach kvtierd at %s: %s\n",
        address.empty() ? absl::StrCat("unix:", socket_choice.Describe()).c_str() : target.c_str(),
        problem.empty() ? status.error_message().c_str() : problem.c_str());
    return 1;
  }
  if (json) {
    std::fputs(ctl::StatusJson(response, /*multiline=*/true).c_str(), stdout);
    return 0;
  }
  std::string table = command == "status"    ? ctl::StatusTable(response)
                      : command == "pools"   ? ctl::PoolsTable(response)
                      : command == "workers" ? ctl::WorkersTable(response)
                                             : ctl::SequencesTable(response);
  std::fputs(table.c_str(), stdout);
  if (!view_note.empty()) {
    std::fprintf(stderr, "kvtierctl: node totals only, no %s listed (%s)\n", command.c_str(),
                 view_note.c_str());
  }
  return 0;
}
