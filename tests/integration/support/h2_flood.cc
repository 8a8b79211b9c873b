#include "tests/integration/support/h2_flood.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::testing {
namespace {

constexpr uint8_t kData = 0, kHeaders = 1, kSettings = 4;
constexpr uint8_t kEndStream = 0x1, kEndHeaders = 0x4;

void AppendFrame(std::string* out, uint8_t type, uint8_t flags, uint32_t stream,
                 const std::string& payload) {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  const char head[9] = {static_cast<char>(n >> 16),
                        static_cast<char>(n >> 8),
                        static_cast<char>(n),
                        static_cast<char>(type),
                        static_cast<char>(flags),
                        static_cast<char>(stream >> 24),
                        static_cast<char>(stream >> 16),
                        static_cast<char>(stream >> 8),
                        static_cast<char>(stream)};
  out->append(head, 9);
  out->append(payload);
}

// HPACK string literal without Huffman coding; lengths below 127 only.
void AppendString(std::string* out, const std::string& s) {
  out->push_back(static_cast<char>(s.size()));
  out->append(s);
}

// One request's header block, every field a literal "without indexing" (RFC 7541 §6.2.2), so
// that no dynamic table state is shared between streams.
std::string HeaderBlock(const std::string& method) {
  std::string h;
  h.push_back(static_cast<char>(0x83));  // :method POST (static index 3)
  h.push_back(static_cast<char>(0x86));  // :scheme http (static index 6)
  h.push_back(0x04);                     // :path, name from static index 4
  AppendString(&h, method);
  h.push_back(0x01);  // :authority, name from static index 1
  AppendString(&h, "localhost");
  h.append("\x0f\x10", 2);  // content-type, name from static index 31 (15 + 16)
  AppendString(&h, "application/grpc");
  h.push_back(0x00);  // a new name
  AppendString(&h, "te");
  AppendString(&h, "trailers");
  return h;
}

bool WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// One connection's flood; false when the daemon dropped it before max_streams.
bool FloodOne(int fd, const FloodOptions& o, FloodProgress* progress) {
  std::string start = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  AppendFrame(&start, kSettings, 0, 0, "");
  if (!WriteAll(fd, start)) return false;
  const std::string headers = HeaderBlock(o.method);
  std::string body(5, '\0');  // gRPC message prefix: not compressed, 4-byte length
  const uint32_t n = static_cast<uint32_t>(o.message.size());
  for (int i = 0; i < 4; ++i) body[1 + i] = static_cast<char>(n >> (24 - 8 * i));
  body += o.message;
  constexpr uint64_t kBatch = 64;
  const uint64_t max = std::min<uint64_t>(o.max_streams, (uint64_t{1} << 30) - 1);
  std::string batch;
  for (uint64_t sent = 0; sent < max;) {
    batch.clear();
    const uint64_t end = std::min(max, sent + kBatch);
    for (uint64_t s = sent; s < end; ++s) {
      const uint32_t id = static_cast<uint32_t>(2 * s + 1);
      AppendFrame(&batch, kHeaders, kEndHeaders, id, headers);
      AppendFrame(&batch, kData, kEndStream, id, body);
    }
    if (!WriteAll(fd, batch)) return false;
    progress->streams += end - sent;
    sent = end;
    if (o.progress_fd >= 0) (void)!write(o.progress_fd, progress, sizeof(*progress));
    if (o.pause > absl::ZeroDuration()) absl::SleepFor(o.pause);
  }
  return true;
}

}  // namespace

absl::StatusOr<FloodProgress> FloodWithoutReading(const FloodOptions& o) {
  signal(SIGPIPE, SIG_IGN);
  FloodProgress progress;
  for (;;) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, o.socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(
          absl::StrCat("connect ", o.socket_path, ": ", std::strerror(errno)));
    }
    ++progress.connections;
    if (FloodOne(fd, o, &progress) || !o.reconnect) return progress;  // fd stays open, unread
    close(fd);
  }
}

}  // namespace kvtier::testing
