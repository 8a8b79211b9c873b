#include "tests/integration/support/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::testing {
namespace {

bool SocketAccepts(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Waits for `pid` up to `timeout`; returns its exit code, or -1 if still running.
int WaitFor(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) << 10;
  }
  return 0;
}

pid_t SpawnProgram(const std::vector<std::string>& argv, const std::string& output_path,
                   const std::vector<std::string>& env) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));  // the child's copy
  int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

std::string BuiltProgram(const std::string& name) {
  const char* dir = std::getenv("KVTIER_BUILD_DIR");
  return absl::StrCat(dir ? dir : "build", "/bin/", name);
}

RunResult RunProgram(const std::vector<std::string>& argv, absl::Duration timeout,
                     const std::vector<std::string>& env) {
  char tmpl[] = "/tmp/kvtier-run-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  pid_t pid = SpawnProgram(argv, tmpl, env);
  RunResult result;
  result.exit_code = WaitFor(pid, timeout);
  if (result.exit_code == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  result.output = ReadFile(tmpl);
  unlink(tmpl);
  return result;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const Options& options) {
  auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess());
  char tmpl[] = "/tmp/kvtierd-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  d->dir_ = tmpl;
  d->socket_path_ = options.socket_path.empty() ? d->dir_ + "/kvtierd.sock" : options.socket_path;
  d->log_path_ = d->dir_ + "/kvtierd.log";
  d->shm_prefix_ = !options.shm_prefix.empty()
                       ? options.shm_prefix
                       : absl::StrCat("/kvtier-test-", getpid(), "-",
                                      std::filesystem::path(d->dir_).filename().string());
  d->config_path_ = d->dir_ + "/kvtierd.toml";
  d->ddr_mib_ = options.ddr_mib;
  d->compressed_mib_ = options.compressed_mib;
  if (absl::Status s = d->RewriteConfig(options.config_text); !s.ok()) return s;
  std::vector<std::string> argv = options.wrapper;
  argv.insert(argv.end(), {BuiltProgram("kvtierd"), "--config", d->config_path_, "--socket",
                           d->socket_path_, "--metrics", options.metrics_address});
  argv.insert(argv.end(), options.args.begin(), options.args.end());
  d->pid_ = SpawnProgram(argv, d->log_path_, options.env);
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (SocketAccepts(d->socket_path_)) return d;
    int status = 0;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      d->pid_ = -1;
      return absl::FailedPreconditionError(absl::StrCat("kvtierd exited early: ", d->Log()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("kvtierd did not listen: ", d->Log()));
}

int DaemonProcess::Stop(int signal, absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int code = WaitFor(pid_, timeout);
  if (code != -1) pid_ = -1;
  return code;
}

std::string DaemonProcess::Log() const { return ReadFile(log_path_); }

bool DaemonProcess::WaitForLog(const std::string& text, absl::Duration timeout) const {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (Log().find(text) != std::string::npos) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status DaemonProcess::RewriteConfig(const std::string& config_text) {
  // Written beside and renamed over, so a SIGHUP never reads a half-written file.
  const std::string tmp = config_path_ + ".tmp";
  {
    std::ofstream config(tmp);
    config << "[pools]\nddr_mib = " << ddr_mib_ << "\ncompressed_mib = " << compressed_mib_
           << "\nshm_prefix = \"" << shm_prefix_ << "\"\n"
           << config_text;
    if (!config.good()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), config_path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status DaemonProcess::Signal(int signal) {
  if (pid_ <= 0) return absl::FailedPreconditionError("kvtierd is not running");
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
  // A killed daemon leaves its segments behind; they carry this test's unique prefix.
  const std::string prefix = shm_prefix_.substr(1);
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ignored)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

}  // namespace kvtier::testing
