#include "daemon/kvtierd/connection_table.h"

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_interceptor.h>
#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace {

// Records each call's connection as soon as its headers arrive (a call that never finishes,
// or whose answer is never read, still counts).
class CallRecorderInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallRecorderInterceptor(ConnectionTable* table, grpc::experimental::ServerRpcInfo* info)
      : table_(table), info_(info) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      table_->NoteCall(info_->server_context()->peer(), absl::Now());
    }
    methods->Proceed();
  }

 private:
  ConnectionTable* const table_;
  grpc::experimental::ServerRpcInfo* const info_;
};

class CallRecorderFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallRecorderFactory(ConnectionTable* table) : table_(table) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallRecorderInterceptor(table_, info);
  }

 private:
  ConnectionTable* const table_;
};

}  // namespace

absl::Status ConnectionLimits::Admit(std::optional<uid_t> uid) {
  if (open_ >= caps_.total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server.max_connections: ", open_, " connections open, the limit is ", caps_.total));
  }
  if (!uid.has_value() && tcp_ >= caps_.tcp) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server.max_tcp_connections: ", tcp_, " TCP connections open, the limit is ", caps_.tcp));
  }
  if (uid.has_value() && per_uid_[*uid] >= caps_.per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("server.max_connections_per_uid: uid ", *uid, " has ", per_uid_[*uid],
                     " connections open, the limit is ", caps_.per_uid));
  }
  ++open_;
  if (uid.has_value()) {
    ++per_uid_[*uid];
  } else {
    ++tcp_;
  }
  return absl::OkStatus();
}

void ConnectionLimits::Release(std::optional<uid_t> uid) {
  --open_;
  if (!uid.has_value()) {
    --tcp_;
  } else if (--per_uid_[*uid] <= 0) {
    per_uid_.erase(*uid);
  }
}

bool SameFile(int fd, dev_t dev, ino_t inode) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == inode;
}

uint64_t ConnectionTable::Add(int fd, std::optional<uid_t> uid, pid_t pid) {
  struct stat st {};
  fstat(fd, &st);
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  by_id_[id] =
      Connection{.id = id, .fd = fd, .dev = st.st_dev, .inode = st.st_ino, .uid = uid, .pid = pid};
  by_fd_[fd] = id;
  return id;
}

void ConnectionTable::NoteCall(const std::string& peer, absl::Time now) {
  int fd = -1;
  if (!absl::StartsWith(peer, "fd:") || !absl::SimpleAtoi(peer.substr(3), &fd)) return;
  absl::MutexLock lock(&mu_);
  const auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  by_id_[it->second].last_call = now;
}

std::vector<Connection> ConnectionTable::Prune() {
  absl::MutexLock lock(&mu_);
  std::vector<Connection> gone;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    const Connection& c = it->second;
    if (SameFile(c.fd, c.dev, c.inode)) {
      ++it;
      continue;
    }
    const auto fd_it = by_fd_.find(c.fd);
    if (fd_it != by_fd_.end() && fd_it->second == c.id) by_fd_.erase(fd_it);
    gone.push_back(c);
    it = by_id_.erase(it);
  }
  return gone;
}

std::vector<Connection> ConnectionTable::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<Connection> all;
  all.reserve(by_id_.size());
  for (const auto& [id, c] : by_id_) all.push_back(c);
  return all;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ConnectionTable::CallRecorder() {
  return std::make_unique<CallRecorderFactory>(this);
}

}  // namespace kvtier::daemon
