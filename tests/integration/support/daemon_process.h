#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_DAEMON_PROCESS_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_DAEMON_PROCESS_H_

// Runs the real kvtierd binary for integration tests: its own temporary directory, socket and
// shared-memory prefix, so tests can run in parallel. Not thread-safe.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

// Path of a program built by this build tree (KVTIER_BUILD_DIR/bin/NAME).
std::string BuiltProgram(const std::string& name);

// Starts `argv` (argv[0] a path) in the background with stdout and stderr appended to
// `output_path`, and `env` ("NAME=VALUE" each) added to its environment; returns its pid.
pid_t SpawnProgram(const std::vector<std::string>& argv, const std::string& output_path,
                   const std::vector<std::string>& env = {});

// Resident memory of process `pid` (VmRSS), in bytes; 0 when it is gone.
uint64_t ResidentBytes(pid_t pid);

// Output and exit status of a finished program.
struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs `argv` to completion (bounded by `timeout`), capturing its output; `env` as SpawnProgram.
RunResult RunProgram(const std::vector<std::string>& argv,
                     absl::Duration timeout = absl::Seconds(30),
                     const std::vector<std::string>& env = {});

class DaemonProcess {
 public:
  struct Options {
    std::string config_text;        // extra TOML written to a config file; "" = none
    std::vector<std::string> args;  // extra flags
    std::vector<std::string> env;   // "NAME=VALUE" added to kvtierd's environment
    // A command kvtierd runs under ({"/usr/bin/unshare", "--pid", "--fork", "--kill-child"}); pid()
    // is then that command's.
    std::vector<std::string> wrapper;
    std::string socket_path;      // "" = a fresh one in the temp dir
    std::string metrics_address;  // --metrics host:port; "" = no metrics endpoint
    std::string shm_prefix;       // "" = one unique to this daemon
    uint32_t ddr_mib = 64;        // pool sizes: small, so tests can fill them
    uint32_t compressed_mib = 32;
  };
  // Starts kvtierd and waits until its socket accepts connections.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const Options& options);
  // Sends SIGKILL if still running, removes the temp dir.
  ~DaemonProcess();

  const std::string& socket_path() const { return socket_path_; }
  std::string address() const { return "unix:" + socket_path_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  const std::string& shm_prefix() const { return shm_prefix_; }
  // Sends `signal`, waits for exit; returns the exit code (128+signal when killed by it).
  int Stop(int signal, absl::Duration timeout = absl::Seconds(10));
  // Everything the daemon logged so far.
  std::string Log() const;
  // Polls the log until it contains `text` (true) or `timeout` passes (false).
  bool WaitForLog(const std::string& text, absl::Duration timeout = absl::Seconds(10)) const;

  // The config file the daemon was started with (in dir()).
  const std::string& config_path() const { return config_path_; }
  // Rewrites that file as Start did, with `config_text` in place of Options::config_text
  // (the pool sizes and shm prefix stay the test's own), e.g. before Signal(SIGHUP).
  absl::Status RewriteConfig(const std::string& config_text);
  // Sends `signal` and returns at once (the daemon keeps running unless the signal stops it).
  absl::Status Signal(int signal);

 private:
  DaemonProcess() = default;
  std::string dir_, socket_path_, log_path_, shm_prefix_, config_path_;
  uint32_t ddr_mib_ = 64, compressed_mib_ = 32;
  pid_t pid_ = -1;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_DAEMON_PROCESS_H_
