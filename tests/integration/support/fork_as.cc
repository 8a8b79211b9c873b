#include "tests/integration/support/fork_as.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace kvtier::testing {

std::string SharedSocket(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/kvtier-sec-" + name + "-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  chmod(dir.c_str(), 0755);
  return dir + "/kvtierd.sock";
}

Child ForkAs(uid_t uid, std::function<int(int go_read, FILE* report)> body) {
  int go[2], rep[2];
  if (pipe(go) != 0 || pipe(rep) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(go[1]);
    close(rep[0]);
    FILE* report = fdopen(rep[1], "w");
    setvbuf(report, nullptr, _IOLBF, 0);
    if (setgroups(0, nullptr) != 0 || setgid(0) != 0 || setuid(uid) != 0) {
      std::fprintf(report, "FAIL cannot drop to uid %d\n", uid);
      _exit(90);
    }
    _exit(body(go[0], report));
  }
  close(go[0]);
  close(rep[1]);
  return {pid, go[1], rep[0]};
}

int Wait(const Child& c, std::string* report) {
  close(c.go_write);
  char buf[4096];
  ssize_t n;
  while ((n = read(c.report_read, buf, sizeof(buf))) > 0) report->append(buf, n);
  close(c.report_read);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

}  // namespace kvtier::testing
