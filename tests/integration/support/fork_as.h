#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_FORK_AS_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_FORK_AS_H_

// Tests that play another user against a real kvtierd (they run as root): a socket directory
// other users can traverse, and children that drop to another uid and report back over a pipe.
// Fork before the test process touches gRPC. Not thread-safe.

#include <sys/types.h>

#include <cstdio>
#include <functional>
#include <string>

namespace kvtier::testing {

// A socket path in a fresh directory of mode 0755 (mkdtemp's own is 0700), named by `name` and
// this process.
std::string SharedSocket(const std::string& name);

// A child forked by ForkAs: its pid, the parent's end of its "go" pipe (closing it, or writing
// to it, is the child's signal) and the parent's end of its report pipe.
struct Child {
  pid_t pid = -1;
  int go_write = -1, report_read = -1;
};

// Runs `body(go_read, report)` in a child that dropped to uid `uid` with gid 0 (the pool group
// of a daemon run by root, so it may register by default); the child exits with body's value
// (90 when it cannot drop). `report` is line-buffered.
Child ForkAs(uid_t uid, std::function<int(int go_read, FILE* report)> body);

// Closes the child's go pipe, reads its report to the end into `report`, reaps it; returns its
// exit code (100 + the signal when a signal ended it).
int Wait(const Child& c, std::string* report);

// One line from `fd` (without its newline), blocking.
std::string ReadLine(int fd);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_FORK_AS_H_
