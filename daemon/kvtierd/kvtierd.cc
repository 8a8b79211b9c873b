// kvtierd: the node-level KV memory-tier daemon. See README.md and deploy/kvtierd.toml.

#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_posix.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/clock/clock.h"
#include "daemon/config/config.h"
#include "daemon/daemon_core.h"
#include "daemon/kvtierd/channel_server.h"
#include "daemon/kvtierd/connection_table.h"
#include "daemon/kvtierd/grpc_acceptor.h"
#include "daemon/kvtierd/listen.h"
#include "daemon/kvtierd/logger.h"
#include "daemon/kvtierd/metrics_server.h"
#include "daemon/kvtierd/reload.h"
#include "daemon/kvtierd/status_page.h"
#include "daemon/kvtierd/unread_guard.h"
#include "daemon/metrics.h"
#include "daemon/pool_backend.h"
#include "daemon/service/service.h"
#include "edge/daemon_socket.h"
#include "edge/health_probe.h"
#include "edge/memory_channel.h"
#include "edge/message_limits.h"

namespace kvtier::daemon {
namespace {

struct Flags {
  std::string config_path;
  std::optional<std::string> socket, tcp, metrics, log_level;  // set: overrides the config
  bool print_default_config = false;
  bool check_config = false;
};

// Where the socket and the metrics address came from, for the log and for errors.
struct Origins {
  std::string socket;   // "--socket", "KVTIER_SOCKET", "server.socket in FILE", ...
  std::string metrics;  // "--metrics", "server.metrics = \"auto\" ..." , ...
};

absl::StatusOr<DaemonConfig> LoadConfig(const Flags& flags, Origins* origins = nullptr) {
  absl::StatusOr<DaemonConfig> config =
      flags.config_path.empty() ? ParseConfig(DefaultConfigText(), "<built-in defaults>")
                                : LoadConfigFile(flags.config_path);
  if (!config.ok()) return config;
  const std::string from_config =
      flags.config_path.empty() ? "the built-in default" : absl::StrCat("in ", flags.config_path);
  const edge::SocketChoice socket = edge::ChooseSocket(
      flags.socket, config->server.socket_path,
      flags.config_path.empty() ? from_config : absl::StrCat("server.socket ", from_config));
  config->server.socket_path = socket.path;
  if (flags.tcp) config->server.tcp_address = *flags.tcp;
  if (flags.metrics) config->server.metrics_address = *flags.metrics;
  const std::string metrics_origin =
      flags.metrics ? "--metrics"
      : config->server.metrics_address == kMetricsAuto
          ? absl::StrCat("server.metrics = \"auto\" ", from_config, ": on only for the daemon on ",
                         edge::kDefaultSocketPath)
          : absl::StrCat("server.metrics ", from_config);
  config->server.metrics_address =
      ResolveMetricsAddress(config->server.metrics_address, config->server.socket_path);
  if (origins != nullptr) *origins = {socket.Describe(), metrics_origin};
  if (flags.log_level) {
    auto level = ParseLogLevel(*flags.log_level);
    if (!level.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--log-level \"", *flags.log_level, "\": ", level.status().message()));
    }
    config->server.log_level = *level;
  }
  if (config->server.socket_path.empty()) {
    return absl::InvalidArgumentError("--socket must not be empty");
  }
  if (!config->server.tcp_address.empty()) {
    if (auto s = RequireLoopback(config->server.tcp_address, "server.tcp"); !s.ok()) return s;
  }
  if (!config->server.metrics_address.empty()) {
    if (auto s = RequireLoopback(config->server.metrics_address, "server.metrics"); !s.ok()) {
      return s;
    }
  }
  config->core.listen_address = absl::StrCat("unix:", config->server.socket_path);
  config->core.metrics_address = config->server.metrics_address;
  return config;
}

// The gid of pools.group ("" = the daemon's own group).
absl::StatusOr<gid_t> PoolGroup(const DaemonConfig& config) {
  if (config.core.shm_group.empty()) return getgid();
  group* g = getgrnam(config.core.shm_group.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pools.group \"", config.core.shm_group, "\" is not a group on this host"));
  }
  return g->gr_gid;
}

// Gives the gRPC socket the configured mode and group, so workers in the group can connect;
// a socket that cannot be restricted so is not served.
absl::Status ShareSocket(const DaemonConfig& config, gid_t gid) {
  const std::string& path = config.server.socket_path;
  if ((config.core.shm_mode & 0007) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pools.mode ", config.core.shm_mode, " gives other users access"));
  }
  if (chmod(path.c_str(), config.core.shm_mode) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chmod ", path, ": ", std::strerror(errno)));
  }
  if (chown(path.c_str(), -1, gid) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("chown ", path, " to gid ", gid, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Runs `core.ReapExpired()` and `core.PrepareSpareExtents()` every `interval` until stopped. One
// owner: Run() starts the thread, the destructor stops and joins it.
class Reaper {
 public:
  Reaper(DaemonCore* core, Logger* log, absl::Duration interval)
      : core_(core), log_(log), interval_(absl::ToChronoMilliseconds(interval)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Reaper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      lock.unlock();
      int reaped = core_->ReapExpired();
      if (reaped > 0) log_->Info(absl::StrCat("lease expired: reaped ", reaped, " worker(s)"));
      core_->PrepareSpareExtents();
      lock.lock();
    }
  }

  DaemonCore* const core_;
  Logger* const log_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Tells systemd the daemon is alive (WATCHDOG=1) only while it serves workers: before each ping
// its thread probes the daemon through its own sockets, as a worker would (edge/health_probe.h: a
// hello and a heartbeat on the memory channel, GetStatus over gRPC on a new connection, each with
// a deadline). A wedged core, a wedged channel, a gRPC listener deaf to new connections or a
// socket path that leads elsewhere stops the pings, and systemd restarts the daemon (WatchdogSec=
// in deploy/kvtierd.service). (A status asked of the core inside the process saw only the
// first.) No thread without a watchdog.
class Watchdog {
 public:
  Watchdog(std::string socket_path, Logger* log) : socket_path_(std::move(socket_path)), log_(log) {
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
    period_ = std::chrono::microseconds(usec / 4);
    // Three checks take a period at most. A healthy daemon answers in milliseconds, so it pings
    // every period and may miss three before systemd's limit (four periods).
    check_timeout_ =
        std::clamp(absl::FromChrono(period_) / 3, absl::Milliseconds(50), absl::Seconds(2));
    thread_ = std::thread([this] { Loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool enabled() const { return thread_.joinable(); }
  std::chrono::microseconds period() const { return period_; }
  absl::Duration check_timeout() const { return check_timeout_; }

 private:
  void Loop() {
    bool healthy = true;
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
      lock.unlock();
      edge::HealthReport report =
          edge::ProbeHealth({.socket_path = socket_path_, .timeout = check_timeout_});
      if (report.ok()) sd_notify(0, "WATCHDOG=1");
      if (report.ok() != healthy) Tell(report);
      healthy = report.ok();
      lock.lock();
    }
  }

  // Logs (and shows in `systemctl status`) each change between passing and failing.
  void Tell(const edge::HealthReport& report) {
    if (report.ok()) {
      log_->Info("watchdog: the self-probe passes again; pinging systemd");
      sd_notify(0, "STATUS=serving");
      return;
    }
    std::vector<std::string> failed;
    for (const edge::HealthCheck& c : report.checks) {
      if (!c.status.ok()) failed.push_back(absl::StrCat(c.name, ": ", c.status.ToString()));
    }
    log_->Warning(absl::StrCat("watchdog: no ping to systemd while the self-probe through ",
                               socket_path_, " fails (", absl::StrJoin(failed, "; "), ")"));
    sd_notify(0, absl::StrCat("STATUS=unhealthy: ", report.FailedChecks(), " failed").c_str());
  }

  const std::string socket_path_;
  Logger* const log_;
  std::chrono::microseconds period_{0};
  absl::Duration check_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Applies what a SIGHUP can change (log level, [limits], [leases]) from `fresh` to `running` and
// the core, and names every changed setting that needs a restart instead.
void ReloadOnSighup(DaemonConfig& running, const DaemonConfig& fresh, DaemonCore* core,
                    Logger& log) {
  ConfigChanges changes = DiffConfigs(running, fresh);
  for (const std::string& change : changes.needs_restart) {
    log.Warning(absl::StrCat("SIGHUP: ", change, " needs a restart; keeping the running value"));
  }
  DaemonConfig next = ApplyReloadable(running, fresh);
  next.core.security.pool_gid = running.core.security.pool_gid;
  std::vector<std::string> revoked;
  if (absl::Status s = core->Reload(next.core, &revoked); !s.ok()) {
    log.Error(absl::StrCat("SIGHUP: keeping the running config: ", s.message()));
    return;
  }
  for (const std::string& line : revoked) log.Warning(absl::StrCat("SIGHUP: ", line));
  // Logged at the old level, so lowering the verbosity is still recorded.
  log.Info(absl::StrCat("SIGHUP: reloaded ", changes.applied.empty()
                                                 ? "(no change to log level, limits, leases or "
                                                   "security)"
                                                 : absl::StrJoin(changes.applied, ", ")));
  running = next;
  log.set_level(running.server.log_level);
}

// The caps of server.max_connections*, the total kept below the descriptor limit.
ConnectionCaps EffectiveCaps(const ServerOptions& server) {
  return ConnectionCaps{.total = std::min(server.max_connections, DescriptorCap()),
                        .per_uid = server.max_connections_per_uid,
                        .tcp = server.max_tcp_connections};
}

// The unix listener, and the TCP one when server.tcp is set (`tcp_port`: the port bound).
absl::StatusOr<std::vector<GrpcAcceptor::Listener>> Listen(const DaemonConfig& config,
                                                           int* tcp_port) {
  std::vector<GrpcAcceptor::Listener> listeners;
  absl::StatusOr<edge::UniqueFd> unix_fd = ListenUnix(config.server.socket_path);
  if (!unix_fd.ok()) return unix_fd.status();
  listeners.push_back({*std::move(unix_fd), false});
  if (!config.server.tcp_address.empty()) {
    absl::StatusOr<edge::UniqueFd> tcp_fd = ListenTcp(config.server.tcp_address, tcp_port);
    if (!tcp_fd.ok()) return tcp_fd.status();
    listeners.push_back({*std::move(tcp_fd), true});
  }
  return listeners;
}

// gRPC with no listener of its own (GrpcAcceptor hands it each connection), bounded per
// connection (streams) and in all (buffered bytes), idle connections closed.
std::unique_ptr<grpc::Server> BuildGrpcServer(const DaemonConfig& config, KvTierService* service,
                                              ConnectionTable* connections) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  // Both limits fit the largest snapshot and plan limits.max_snapshot_entries allows.
  const uint64_t entries = config.core.max_snapshot_entries;
  builder.SetMaxReceiveMessageSize(static_cast<int>(edge::MaxSnapshotBytes(entries)));
  builder.SetMaxSendMessageSize(static_cast<int>(edge::MaxPlanBytes(entries)));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.server.max_concurrent_streams);
  if (config.server.idle_timeout > absl::ZeroDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_IDLE_MS,
        static_cast<int>(absl::ToInt64Milliseconds(config.server.idle_timeout)));
  }
  grpc::ResourceQuota quota("kvtierd");
  quota.Resize(static_cast<size_t>(config.server.grpc_memory_mib) << 20);
  builder.SetResourceQuota(quota);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> recorders;
  recorders.push_back(connections->CallRecorder());
  builder.experimental().SetInterceptorCreators(std::move(recorders));
  return builder.BuildAndStart();
}

// Prometheus' endpoint on server.metrics. The port is tried first, so that one in use (another
// kvtierd given the same port, or another program) is an error naming it and what to change.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(
    const std::string& address, const std::string& origin,
    std::shared_ptr<prometheus::Registry> registry) {
  const std::string fix = absl::StrCat(
      "; set server.metrics (or --metrics) to a free loopback port, or \"\" for no metrics (",
      origin, ")");
  int port = 0;
  if (absl::StatusOr<edge::UniqueFd> probe = ListenTcp(address, &port, "server.metrics");
      !probe.ok()) {
    const bool in_use = absl::StrContains(probe.status().message(), std::strerror(EADDRINUSE));
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", probe.status().message(),
                     in_use ? absl::StrCat(" (another process listens there: ss -ltnp 'sport = :",
                                           address.substr(address.rfind(':') + 1), "')")
                            : "",
                     fix));
  }
  absl::StatusOr<std::unique_ptr<MetricsServer>> served =
      MetricsServer::Start(address, std::move(registry));
  if (!served.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", served.status().message(), fix));
  }
  return served;
}

int Serve(const Flags& flags, DaemonConfig config, const Origins& origins) {
  Logger log(config.server.log_level);
  log.Info(absl::StrCat("starting kvtierd ", KVTIER_VERSION, " (config: ",
                        flags.config_path.empty() ? "built-in defaults" : flags.config_path,
                        "; socket ", origins.socket, ")"));
  if (auto s = PrepareUnixSocketPath(config.server.socket_path); !s.ok()) {
    log.Error(std::string(s.message()));
    return 1;
  }
  absl::StatusOr<gid_t> pool_gid = PoolGroup(config);
  if (!pool_gid.ok()) {
    log.Error(std::string(pool_gid.status().message()));
    return 1;
  }
  config.core.security.pool_gid = *pool_gid;
  std::unique_ptr<Metrics> metrics = Metrics::Create();
  std::unique_ptr<MetricsServer> exposer;
  if (config.server.metrics_address.empty()) {
    log.Info(absl::StrCat("metrics off (", origins.metrics, ")"));
  } else {
    absl::StatusOr<std::unique_ptr<MetricsServer>> served =
        ServeMetrics(config.server.metrics_address, origins.metrics, metrics->registry());
    if (!served.ok()) {
      log.Error(std::string(served.status().message()));
      return 1;
    }
    exposer = *std::move(served);
    log.Info(absl::StrCat("metrics on http://", config.server.metrics_address,
                          "/metrics, status page on http://", config.server.metrics_address, "/ (",
                          origins.metrics, ")"));
  }
  absl::StatusOr<std::string> pool_memory = ResolvePoolBackend(
      &config.core, [&config] { return edge::cuda::Driver::Load(config.core.cuda_library); });
  if (!pool_memory.ok()) {
    log.Error(absl::StrCat("cannot create pools: ", pool_memory.status().message()));
    return 1;
  }
  log.Info(*pool_memory);
  absl::StatusOr<std::unique_ptr<DaemonCore>> core =
      DaemonCore::Create(config.core, MonotonicClock::Get(), metrics.get());
  if (!core.ok()) {
    log.Error(absl::StrCat("cannot create pools: ", core.status().message()));
    return 1;
  }
  (*core)->PrepareSpareExtents();  // the first workers' grants need not make extents
  if (exposer != nullptr) {
    exposer->SetStatusPage([c = core->get()] { return RenderStatusPage(c->OperatorStatus()); });
  }
  // Before the core goes (on every return): waits for pages being rendered from it.
  absl::Cleanup page_off = [&exposer] {
    if (exposer != nullptr) exposer->SetStatusPage(nullptr);
  };
  log.Info(absl::StrCat("pools ready: DDR ", config.core.ddr_pool_bytes >> 20, " MiB, compressed ",
                        config.core.compressed_pool_bytes >> 20, " MiB"));

  // The memory channel listens before the gRPC socket does: a worker that connects as soon as
  // the socket accepts says hello on the channel next.
  const std::string channel_path = edge::ChannelPathFor(config.server.socket_path);
  absl::StatusOr<edge::UniqueFd> channel =
      edge::ListenChannel(channel_path, config.core.shm_mode, *pool_gid);
  if (!channel.ok()) {
    log.Error(absl::StrCat("cannot open the memory channel: ", channel.status().message()));
    return 1;
  }
  auto channel_server = std::make_unique<ChannelServer>(
      *std::move(channel), core->get(),
      ChannelLaneOptions{.realtime_priority = config.server.heartbeat_priority,
                         .metrics = metrics.get()},
      ChannelLaneOptions{.realtime_priority = config.server.snapshot_priority,
                         .metrics = metrics.get()},
      [&log](const std::string& m) { log.Info(m); },
      [&log](const std::string& m) { log.Warning(m); },
      [&log](const std::string& m) { log.Debug(m); },
      ChannelServerLimits{.max_connections = config.server.channel_connections,
                          .max_connections_per_uid = config.server.channel_connections_per_uid,
                          .request_timeout = config.server.channel_request_timeout});
  KvTierService service(core->get(), config.policy, config.server.policy_threads);
  ConnectionTable connections;
  std::unique_ptr<grpc::Server> server = BuildGrpcServer(config, &service, &connections);
  int tcp_port = 0;
  absl::StatusOr<std::vector<GrpcAcceptor::Listener>> listeners = Listen(config, &tcp_port);
  if (server == nullptr || !listeners.ok()) {
    log.Error(absl::StrCat("cannot listen on unix:", config.server.socket_path,
                           config.server.tcp_address.empty() ? "" : " / ",
                           config.server.tcp_address, ": ",
                           listeners.ok() ? "gRPC did not start" : listeners.status().message()));
    return 1;
  }
  if (absl::Status s = ShareSocket(config, *pool_gid); !s.ok()) {
    log.Error(absl::StrCat("refusing to serve: ", s.message()));
    return 1;
  }
  const ConnectionCaps caps = EffectiveCaps(config.server);
  log.Info(absl::StrCat(
      "listening on unix:", config.server.socket_path,
      tcp_port ? absl::StrCat(" and ", config.server.tcp_address, " (port ", tcp_port, ")") : "",
      "; memory channel ", channel_path, "; at most ", caps.total, " gRPC connections, ",
      caps.per_uid, " per uid, ", caps.tcp, " over TCP"));
  auto acceptor = std::make_unique<GrpcAcceptor>(
      *std::move(listeners), caps, &connections,
      [s = server.get()](int fd) { grpc::AddInsecureChannelFromFd(s, fd); },
      [&log](const std::string& m) { log.Warning(m); }, metrics.get());
  std::unique_ptr<UnreadGuard> unread_guard;
  if (config.server.unread_timeout > absl::ZeroDuration()) {
    unread_guard = std::make_unique<UnreadGuard>(
        &connections, config.server.unread_timeout,
        std::min(absl::Milliseconds(100), config.server.unread_timeout / 4),
        [&log](const std::string& m) { log.Warning(m); }, metrics.get());
  }
  auto reaper = std::make_unique<Reaper>(core->get(), &log, config.server.reap_interval);
  auto watchdog = std::make_unique<Watchdog>(config.server.socket_path, &log);
  if (watchdog->enabled()) {
    log.Info(absl::StrCat("systemd watchdog: a ping every ", watchdog->period().count() / 1000,
                          " ms while a probe through the sockets passes (",
                          absl::FormatDuration(watchdog->check_timeout()), " a check)"));
  }
  sd_notify(0, "READY=1\nSTATUS=serving");

  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&signals, s);
  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != SIGHUP) {
      log.Info(absl::StrCat("received ", sig == SIGTERM ? "SIGTERM" : "SIGINT", ", stopping"));
      break;
    }
    if (flags.config_path.empty()) {
      log.Info("SIGHUP: no config file to reload (running on built-in defaults)");
      continue;
    }
    absl::StatusOr<DaemonConfig> fresh = LoadConfig(flags);
    if (!fresh.ok()) {
      log.Error(absl::StrCat("SIGHUP: keeping the running config: ", fresh.status().message()));
      continue;
    }
    ReloadOnSighup(config, *fresh, core->get(), log);
  }
  sd_notify(0, "STOPPING=1");
  acceptor.reset();  // no new connections
  unlink(config.server.socket_path.c_str());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  watchdog.reset();
  reaper.reset();
  unread_guard.reset();
  channel_server.reset();
  unlink(channel_path.c_str());
  server.reset();
  std::move(page_off).Invoke();
  core->reset();  // unmaps and removes the pools
  log.Info("stopped");
  return 0;
}

}  // namespace
}  // namespace kvtier::daemon

int main(int argc, char** argv) {
  using kvtier::daemon::Flags;
  // Signals are handled by sigwait in the main thread; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Under a file-size limit (systemd's LimitFSIZE=, prlimit --fsize) an extent that cannot be
  // sized fails with EFBIG: the pool cannot grow and plans degrade. SIGXFSZ would kill the
  // daemon instead, and every worker's session with it.
  signal(SIGXFSZ, SIG_IGN);
  // The daemon holds every worker's extent descriptors: /proc/PID/fd must not lead to them
  // (only CAP_SYS_PTRACE passes a non-dumpable process's ptrace check).
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, under one global
  // lock (2% of the daemon's time at 32 workers, measured). The lock order is fixed and written
  // on the core's class; the unit tests, which keep the check, would catch a cycle.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  CLI::App app{
      "kvtierd: the kvtier node daemon. Owns the host's DDR and compressed KV pools and "
      "answers workers' scoring snapshots with tier plans."};
  Flags flags;
  app.add_option("-c,--config", flags.config_path, "TOML config file (default: built-in defaults)");
  app.add_option("--socket", flags.socket,
                 absl::StrCat("Unix socket path (default: $", kvtier::edge::kSocketEnv,
                              " if set, else server.socket)"));
  app.add_option("--tcp", flags.tcp, "Also listen on this loopback host:port (server.tcp)");
  app.add_option("--metrics", flags.metrics,
                 "Prometheus endpoint host:port, \"\" = off (default: server.metrics, \"auto\": "
                 "127.0.0.1:9464 for the daemon on /run/kvtier/kvtierd.sock, off for others)");
  app.add_option("--log-level", flags.log_level, "debug | info | warning | error");
  app.add_flag("--print-default-config", flags.print_default_config,
               "Print the documented default config and exit");
  app.add_flag("--check-config", flags.check_config, "Validate the config and exit");
  app.set_version_flag("--version", KVTIER_VERSION);
  CLI11_PARSE(app, argc, argv);

  if (flags.print_default_config) {
    std::fwrite(kvtier::daemon::DefaultConfigText().data(), 1,
                kvtier::daemon::DefaultConfigText().size(), stdout);
    return 0;
  }
  kvtier::daemon::Origins origins;
  absl::StatusOr<kvtier::daemon::DaemonConfig> config = kvtier::daemon::LoadConfig(flags, &origins);
  if (!config.ok()) {
    std::fprintf(stderr, "kvtierd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (flags.check_config) {
    std::printf("kvtierd: config OK\n");
    return 0;
  }
  return kvtier::daemon::Serve(flags, *std::move(config), origins);
}
