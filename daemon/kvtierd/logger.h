#ifndef KVTIER_DAEMON_KVTIERD_LOGGER_H_
#define KVTIER_DAEMON_KVTIERD_LOGGER_H_

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "daemon/config/config.h"

namespace kvtier::daemon {

// One line per event on stderr (journald adds its own timestamp; we add ours for plain runs):
// "2026-11-29T10:00:00.123Z kvtierd[1234] INFO listening on unix:/run/kvtier/kvtierd.sock".
// Thread-safe; the level may change at run time (SIGHUP).
class Logger {
 public:
  explicit Logger(LogLevel level, FILE* out = stderr) : level_(level), out_(out) {}
  void set_level(LogLevel level) { level_.store(level); }
  LogLevel level() const { return level_.load(); }
  void Log(LogLevel level, const std::string& message);
  void Debug(const std::string& m) { Log(LogLevel::kDebug, m); }
  void Info(const std::string& m) { Log(LogLevel::kInfo, m); }
  void Warning(const std::string& m) { Log(LogLevel::kWarning, m); }
  void Error(const std::string& m) { Log(LogLevel::kError, m); }

 private:
  std::atomic<LogLevel> level_;
  absl::Mutex mu_;
  FILE* const out_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_LOGGER_H_
