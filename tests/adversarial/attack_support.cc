#include "tests/adversarial/attack_support.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/support/http_get.h"

namespace kvtier::testing {

Children::~Children() {
  for (Child& c : children_) {
    kill(c.pid, SIGCONT);
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    close(c.fd);
  }
}

int Children::Spawn(const std::function<void(int)>& body) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    body(p[1]);
    for (;;) pause();
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  children_.push_back({pid, p[0]});
  return static_cast<int>(children_.size()) - 1;
}

void Children::Drain(int i, size_t size) {
  std::string buf(size, '\0');
  while (read(children_[i].fd, buf.data(), size) == static_cast<ssize_t>(size)) {
    children_[i].last = buf;
  }
}

bool Children::Exited(int i) {
  Child& c = children_[i];
  if (!c.exited && waitpid(c.pid, nullptr, WNOHANG) == c.pid) c.exited = true;
  return c.exited;
}

AttackDaemon StartAttackDaemon(const std::string& config_text,
                               const std::vector<std::string>& wrapper) {
  AttackDaemon d;
  d.metrics_port = *FreeLoopbackPort();
  auto p = DaemonProcess::Start({.config_text = config_text,
                                 .wrapper = wrapper,
                                 .metrics_address = absl::StrCat("127.0.0.1:", d.metrics_port)});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return d;
  d.process = *std::move(p);
  d.pid = wrapper.empty() ? d.process->pid() : OnlyChild(d.process->pid());
  return d;
}

pid_t OnlyChild(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/task/", pid, "/children"));
  pid_t child = -1;
  in >> child;
  return child;
}

absl::Duration CpuTime(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  uint64_t ticks = 0;
  for (int f = 3; f <= 15 && rest >> field; ++f) {
    if (f >= 14) ticks += std::stoull(field);
  }
  return absl::Seconds(static_cast<double>(ticks) / sysconf(_SC_CLK_TCK));
}

int OpenDescriptors(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

bool StatusAnswers(const DaemonProcess& daemon, absl::Duration timeout, std::string* output) {
  const RunResult r =
      RunProgram({BuiltProgram("kvtierctl"), "--socket", daemon.socket_path(), "status"}, timeout);
  if (output != nullptr) *output = r.output;
  return r.exit_code == 0;
}

}  // namespace kvtier::testing
