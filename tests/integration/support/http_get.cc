#include "tests/integration/support/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace kvtier::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// Closes the descriptor on every path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status WaitReady(int fd, short events, absl::Time deadline) {
  int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
  if (ms <= 0) return absl::DeadlineExceededError("HTTP request timed out");
  pollfd p{fd, events, 0};
  int r = poll(&p, 1, ms);
  if (r == 0) return absl::DeadlineExceededError("HTTP request timed out");
  if (r < 0) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::StatusOr<HttpResponse> ParseResponse(const std::string& raw) {
  // "HTTP/1.x NNN reason\r\n" headers "\r\n\r\n" body
  size_t header_end = raw.find("\r\n\r\n");
  int status = 0;
  if (raw.rfind("HTTP/1.", 0) != 0 || raw.size() < 12 ||
      !absl::SimpleAtoi(raw.substr(9, 3), &status) || header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("malformed HTTP response: ", raw.substr(0, 200)));
  }
  return HttpResponse{status, raw.substr(header_end + 4)};
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr = Loopback(port);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  const std::string request = absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1:", port,
                                           "\r\nAccept: */*\r\nConnection: close\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    if (absl::Status s = WaitReady(fd.get(), POLLOUT, deadline); !s.ok()) return s;
    ssize_t n = send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    if (absl::Status s = WaitReady(fd.get(), POLLIN, deadline); !s.ok()) return s;
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  return ParseResponse(raw);
}

std::string UrlEncode(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

absl::StatusOr<int> FreeLoopbackPort() {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("no free loopback port: ", std::strerror(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

double ScrapeMetric(int port, const std::string& name) {
  absl::StatusOr<HttpResponse> r = HttpGet(port, "/metrics", absl::Seconds(2));
  if (!r.ok()) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

double WaitForMetric(int port, const std::string& name, double at_least, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  double v = ScrapeMetric(port, name);
  while (v < at_least && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    v = ScrapeMetric(port, name);
  }
  return v;
}

}  // namespace kvtier::testing
