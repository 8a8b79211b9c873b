#ifndef KVTIER_TESTS_ADVERSARIAL_ATTACK_SUPPORT_H_
#define KVTIER_TESTS_ADVERSARIAL_ATTACK_SUPPORT_H_

// What the attack tests share: child processes that report fixed-size records over a pipe, a
// throwaway kvtierd with a metrics port, and figures read from /proc. Not thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/integration/support/daemon_process.h"

namespace kvtier::testing {

// Child processes, SIGKILLed (after SIGCONT) and reaped when this goes away.
class Children {
 public:
  ~Children();
  // Forks a child that runs `body(report_fd)` and then waits to be killed (so whatever the body
  // left open stays open); returns its index.
  int Spawn(const std::function<void(int report_fd)>& body);
  pid_t pid(int i) const { return children_[i].pid; }
  // The last whole record of `size` bytes child `i` wrote (zeros if none yet).
  template <typename T>
  T Last(int i) {
    Drain(i, sizeof(T));
    T t{};
    if (children_[i].last.size() == sizeof(T)) std::memcpy(&t, children_[i].last.data(), sizeof(T));
    return t;
  }
  // Whether child `i` ended (other than by this class).
  bool Exited(int i);

 private:
  struct Child {
    pid_t pid;
    int fd;
    std::string last;
    bool exited = false;
  };
  void Drain(int i, size_t size);
  std::vector<Child> children_;
};

struct AttackDaemon {
  int metrics_port = 0;
  pid_t pid = -1;  // kvtierd's own (under a wrapper, the wrapper's child)
  std::unique_ptr<DaemonProcess> process;
};

// Starts kvtierd with `config_text` and a metrics endpoint, under `wrapper` if given.
AttackDaemon StartAttackDaemon(const std::string& config_text,
                               const std::vector<std::string>& wrapper = {});

// The child of process `pid` (its only one), or -1.
pid_t OnlyChild(pid_t pid);

// CPU time (user + system) process `pid` has used.
absl::Duration CpuTime(pid_t pid);

// Descriptors process `pid` has open.
int OpenDescriptors(pid_t pid);

// Whether `kvtierctl status` answers within `timeout` (its output in `output`).
bool StatusAnswers(const DaemonProcess& daemon, absl::Duration timeout, std::string* output);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_ADVERSARIAL_ATTACK_SUPPORT_H_
