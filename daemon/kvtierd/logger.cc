#include "daemon/kvtierd/logger.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::daemon {

void Logger::Log(LogLevel level, const std::string& message) {
  if (level < level_.load()) return;
  std::string when = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string name = absl::AsciiStrToUpper(std::string(LogLevelName(level)));
  absl::MutexLock lock(&mu_);
  std::fprintf(out_, "%s kvtierd[%d] %s %s\n", when.c_str(), static_cast<int>(getpid()),
               name.c_str(), message.c_str());
  std::fflush(out_);
}

}  // namespace kvtier::daemon
