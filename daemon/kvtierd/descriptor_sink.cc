#include "daemon/kvtierd/descriptor_sink.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace {

// A unix socket's queued messages read before it closes, and how deep descriptors found in them
// are searched in turn: enough for what a peer can queue on one connection of the channel
// (its receive buffer), bounded so that a peer cannot make one close a long job.
constexpr int kMaxDrainedMessages = 64;
constexpr int kMaxDrainDepth = 2;

// A socket's close() returns at once, whatever it had left to send (an abortive close).
void NoLinger(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

bool IsUnixSocket(int fd) {
  int domain = 0;
  socklen_t len = sizeof(domain);
  return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

void Dispose(int fd, int depth);

// Takes the descriptors out of the messages still queued on unix socket `fd`, so that closing it
// does not close them in its own context, and disposes of them first.
void Drain(int fd, int depth) {
  thread_local std::string bytes(64 << 10, '\0');
  for (int m = 0; m < kMaxDrainedMessages; ++m) {
    iovec iov{bytes.data(), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * edge::kMaxFdsPerDatagram)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    if (recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return;
    std::vector<edge::UniqueFd> sent;
    edge::CollectDescriptors(msg, &sent);
    for (edge::UniqueFd& f : sent) {
      NoLinger(f.get());
      Dispose(f.Release(), depth + 1);
    }
  }
}

void Dispose(int fd, int depth) {
  if (depth < kMaxDrainDepth && IsUnixSocket(fd)) Drain(fd, depth);
  close(fd);
}

}  // namespace

struct DescriptorSink::State {
  absl::Mutex mu;
  std::deque<int> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;
  std::atomic<size_t> backlog{0};
  std::atomic<int64_t> busy_since_ns{0};  // 0 = idle

  void Run() {
    for (;;) {
      int fd;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](State* s)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return !s->queue.empty() || s->stop; },
            this));
        if (queue.empty()) {
          done = true;
          return;
        }
        fd = queue.front();
        queue.pop_front();
      }
      busy_since_ns.store(absl::GetCurrentTimeNanos());
      Dispose(fd, 0);
      busy_since_ns.store(0);
      backlog.fetch_sub(1);
    }
  }
};

DescriptorSink::DescriptorSink(Options options)
    : options_(std::move(options)), state_(std::make_shared<State>()) {
  thread_ = std::thread([state = state_] { state->Run(); });
}

DescriptorSink::~DescriptorSink() {
  bool done;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stop = true;
    done = state_->mu.AwaitWithTimeout(absl::Condition(&state_->done), options_.shutdown_wait);
  }
  if (done) {
    thread_.join();
    return;
  }
  // The thread holds the state; the process's exit ends the close() it is stuck in.
  thread_.detach();
  if (options_.log_warning) {
    options_.log_warning(absl::StrCat(
        "descriptor sink: ", state_->backlog.load(), " descriptors from peers still closing after ",
        absl::FormatDuration(options_.shutdown_wait), "; stopping without them"));
  }
}

void DescriptorSink::Close(edge::UniqueFd fd) {
  if (!fd.valid()) return;
  NoLinger(fd.get());
  state_->backlog.fetch_add(1);
  absl::MutexLock lock(&state_->mu);
  state_->queue.push_back(fd.Release());
}

void DescriptorSink::Close(std::vector<edge::UniqueFd> fds) {
  for (edge::UniqueFd& fd : fds) Close(std::move(fd));
}

size_t DescriptorSink::backlog() const { return state_->backlog.load(); }

bool DescriptorSink::Full() const { return backlog() >= options_.capacity; }

absl::Duration DescriptorSink::Stalled() const {
  const int64_t since = state_->busy_since_ns.load();
  if (since == 0) return absl::ZeroDuration();
  return absl::Nanoseconds(absl::GetCurrentTimeNanos() - since);
}

}  // namespace kvtier::daemon
