#include "tests/adversarial/daemon_identity/channel_relay.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "edge/memory_channel.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::testing {
namespace {

bool CarriesSecret(const v1::ChannelRequest& r) {
  return (r.has_fetch_extents() && !r.fetch_extents().session_secret().empty()) ||
         (r.has_heartbeat() && !r.heartbeat().session_secret().empty()) ||
         (r.has_snapshot() && !r.snapshot().session_secret().empty());
}

// A memfd in place of the daemon's extent of `bytes`.
edge::UniqueFd Forged(RelayOptions::Forge forge, uint64_t bytes) {
  edge::UniqueFd fd(memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  const uint64_t size = forge == RelayOptions::Forge::kWrongSize ? 2 * bytes : bytes;
  if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return edge::UniqueFd();
  if (forge == RelayOptions::Forge::kWrongSize) {
    fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
  }
  return fd;
}

// Whether the relay could read the memory behind `fd` (it maps it and reads its first byte).
bool ReadsPage(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return false;
  void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  volatile uint8_t byte = *static_cast<const uint8_t*>(p);
  (void)byte;
  munmap(p, 4096);
  return true;
}

// Relays one request from `client`; false when the client is gone.
bool RelayOne(const RelayOptions& o, int client, RelayReport* report) {
  v1::ChannelRequest request;
  if (!edge::ReceiveMessage(client, &request).ok()) return false;
  ++report->requests;
  if (CarriesSecret(request)) ++report->secrets;
  absl::StatusOr<edge::UniqueFd> up = edge::ConnectChannel(o.upstream, absl::Seconds(2));
  if (!up.ok() || !edge::SendMessage(up->get(), request, {}).ok()) return false;
  v1::ChannelReply reply;
  absl::StatusOr<std::vector<edge::UniqueFd>> fds = edge::ReceiveMessage(up->get(), &reply);
  if (!fds.ok()) return false;
  report->descriptors += static_cast<int>(fds->size());
  for (size_t i = 1; i < fds->size(); ++i) {
    if (ReadsPage((*fds)[i].get())) ++report->pages_read;
    struct stat st;
    if (o.forge != RelayOptions::Forge::kNone && request.has_fetch_extents() &&
        fstat((*fds)[i].get(), &st) == 0) {
      (*fds)[i] = Forged(o.forge, static_cast<uint64_t>(st.st_size));
    }
  }
  std::vector<int> raw;
  for (const edge::UniqueFd& fd : *fds) raw.push_back(fd.get());
  return edge::SendMessage(client, reply, raw).ok();
}

[[noreturn]] void RunRelay(const RelayOptions& o, int report_fd, int ready_fd) {
  if (o.uid != geteuid() &&
      (setgroups(0, nullptr) != 0 || setgid(o.gid) != 0 || setuid(o.uid) != 0)) {
    _exit(3);
  }
  absl::StatusOr<edge::UniqueFd> listener =
      edge::ListenChannel(o.listen_path, 0777, static_cast<gid_t>(-1));
  if (!listener.ok()) _exit(4);
  const char ok = 1;
  if (write(ready_fd, &ok, 1) != 1) _exit(5);
  close(ready_fd);
  RelayReport report;
  std::vector<edge::UniqueFd> clients;
  const absl::Time deadline = absl::Now() + o.lifetime;
  while (absl::Now() < deadline) {
    std::vector<pollfd> polled{{listener->get(), POLLIN, 0}};
    for (const edge::UniqueFd& c : clients) polled.push_back({c.get(), POLLIN, 0});
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    for (size_t i = polled.size(); i-- > 1;) {
      if (polled[i].revents == 0) continue;
      if (!RelayOne(o, clients[i - 1].get(), &report)) clients.erase(clients.begin() + (i - 1));
      if (write(report_fd, &report, sizeof(report)) != sizeof(report)) _exit(6);
    }
    if ((polled[0].revents & POLLIN) != 0 && clients.size() < 64) {
      const int c = accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) clients.emplace_back(c);
    }
  }
  _exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChannelRelay>> ChannelRelay::Start(const RelayOptions& options) {
  int report[2], ready[2];
  if (pipe2(report, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  if (pipe2(ready, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    close(report[0]);
    close(ready[0]);
    RunRelay(options, report[1], ready[1]);
  }
  close(report[1]);
  close(ready[1]);
  auto relay = std::unique_ptr<ChannelRelay>(new ChannelRelay(pid, report[0]));
  pollfd p{ready[0], POLLIN, 0};
  char ok = 0;
  const bool ready_ok = poll(&p, 1, 5000) == 1 && read(ready[0], &ok, 1) == 1;
  close(ready[0]);
  if (!ready_ok) {
    int status = 0;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    relay->pid_ = -1;
    return absl::InternalError(absl::StrCat("the relay did not start listening at ",
                                            options.listen_path, " (exit status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")"));
  }
  fcntl(report[0], F_SETFL, O_NONBLOCK);
  return relay;
}

ChannelRelay::~ChannelRelay() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close(report_fd_);
}

RelayReport ChannelRelay::Report() {
  RelayReport r;
  while (read(report_fd_, &r, sizeof(r)) == sizeof(r)) last_ = r;
  return last_;
}

}  // namespace kvtier::testing
