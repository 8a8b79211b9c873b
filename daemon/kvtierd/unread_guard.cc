#include "daemon/kvtierd/unread_guard.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {
namespace {

int IntOption(int fd, int name) {
  int v = -1;
  socklen_t n = sizeof(v);
  return getsockopt(fd, SOL_SOCKET, name, &v, &n) == 0 ? v : -1;
}

// A connection accepted on the unix stream socket at `path` (not the listener itself).
bool AcceptedOn(int fd, const std::string& path) {
  if (IntOption(fd, SO_DOMAIN) != AF_UNIX || IntOption(fd, SO_TYPE) != SOCK_STREAM ||
      IntOption(fd, SO_ACCEPTCONN) != 0) {
    return false;
  }
  sockaddr_un addr{};
  socklen_t n = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &n) != 0 ||
      n <= offsetof(sockaddr_un, sun_path)) {
    return false;
  }
  return std::strncmp(addr.sun_path, path.c_str(), sizeof(addr.sun_path)) == 0;
}

// A duplicate of `fd` if it is still the socket `inode` (gRPC owns the descriptor and may have
// closed it, and the number been reused, since the sample), else none.
edge::UniqueFd DupIfSame(int fd, uint64_t inode) {
  edge::UniqueFd dup_fd(dup(fd));
  struct stat st;
  if (dup_fd.valid() && (fstat(dup_fd.get(), &st) != 0 || st.st_ino != inode)) dup_fd.Reset();
  return dup_fd;
}

}  // namespace

std::vector<uint64_t> UnreadTracker::Update(
    absl::Time now, const std::vector<std::pair<uint64_t, uint64_t>>& samples, const Quiet& quiet) {
  std::map<uint64_t, Seen> next;
  std::vector<uint64_t> drop;
  for (const auto& [key, unread] : samples) {
    auto it = seen_.find(key);
    Seen s = it == seen_.end() ? Seen{unread, now} : it->second;
    if (unread == 0 || unread < s.unread) {
      s.progress = now;
      s.stuck_since = absl::InfiniteFuture();
    } else if (s.stuck_since == absl::InfiniteFuture()) {
      s.stuck_since = now;
    }
    s.unread = unread;
    if (now - s.progress >= timeout_) {
      if (!quiet || !quiet(key, now - s.stuck_since)) {
        drop.push_back(key);
        continue;  // forgotten: seen again, it starts over
      }
      s.progress = s.stuck_since = now;  // paused, not stuck: a fresh clock from here
    }
    next[key] = s;
  }
  seen_ = std::move(next);
  return drop;
}

UnreadGuard::UnreadGuard(std::string socket_path, absl::Duration timeout, absl::Duration period,
                         SinceLastCall since_last_call, std::function<void(const std::string&)> log,
                         Metrics* metrics)
    : socket_path_(std::move(socket_path)),
      period_(period),
      since_last_call_(std::move(since_last_call)),
      log_(std::move(log)),
      metrics_(metrics),
      tracker_(timeout),
      thread_([this] { Loop(); }) {}

UnreadGuard::~UnreadGuard() {
  stop_.Notify();
  thread_.join();
}

void UnreadGuard::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(period_)) Sweep();
}

void UnreadGuard::Sweep() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  std::vector<std::pair<uint64_t, uint64_t>> samples;
  std::map<uint64_t, int> fd_of;  // socket inode -> descriptor at the time of the sample
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    struct stat st;
    if (fd <= 2 || fd == dirfd(dir) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int unread = 0;
    if (!AcceptedOn(fd, socket_path_) || ioctl(fd, SIOCOUTQ, &unread) != 0) continue;
    samples.emplace_back(st.st_ino, static_cast<uint64_t>(unread));
    fd_of[st.st_ino] = fd;
  }
  closedir(dir);
  // A peer process with a session that has called nothing since its bytes went unread.
  const auto quiet = [&](uint64_t inode, absl::Duration stuck_for) {
    if (!since_last_call_) return false;
    const edge::UniqueFd fd = DupIfSame(fd_of[inode], inode);
    const absl::StatusOr<edge::PeerCredentials> peer =
        fd.valid() ? edge::PeerOf(fd.get()) : absl::NotFoundError("closed");
    if (!peer.ok()) return false;
    const std::optional<absl::Duration> since = since_last_call_(peer->pid);
    return since.has_value() && *since >= stuck_for;
  };
  for (uint64_t inode : tracker_.Update(absl::Now(), samples, quiet)) {
    const edge::UniqueFd fd = DupIfSame(fd_of[inode], inode);
    if (!fd.valid()) continue;
    const edge::PeerCredentials peer = edge::PeerOf(fd.get()).value_or(edge::PeerCredentials{});
    int unread = 0;
    ioctl(fd.get(), SIOCOUTQ, &unread);
    shutdown(fd.get(), SHUT_RDWR);
    if (metrics_ != nullptr) metrics_->CountDroppedConnection(Metrics::ConnectionDrop::kGrpcUnread);
    log_(absl::StrCat("dropped a connection whose peer stopped reading: pid ", peer.pid, " uid ",
                      peer.uid, " left ", unread, " bytes unread for ",
                      absl::FormatDuration(tracker_.timeout()), " (server.unread_timeout_ms)"));
  }
}

}  // namespace kvtier::daemon
