#include "tests/integration/support/h2_flood.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::testing {
namespace {

constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoaway = 7,
                  kWindowUpdate = 8;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;

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

uint32_t Be32(const std::string& b, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(b[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(b[at + 3]));
}

// HoldUnfinishedMessages' connection: what the server allows, what is owed to it.
class Holder {
 public:
  Holder(int fd, const HoldOptions& o) : fd_(fd), o_(o), headers_(HeaderBlock(o.method)) {
    out_ = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    AppendFrame(&out_, kSettings, 0, 0, "");
  }
  HoldProgress Run() {
    const absl::Time deadline = absl::Now() + o_.duration;
    absl::Time reported = absl::InfinitePast();
    while (absl::Now() < deadline && p_.closed == 0) {
      if (out_.empty()) Produce();
      pollfd pfd{fd_, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0};
      poll(&pfd, 1, 20);
      if ((pfd.revents & POLLIN) != 0) ReadAll();
      if ((pfd.revents & POLLOUT) != 0) WriteSome();
      if ((pfd.revents & (POLLHUP | POLLERR)) != 0) p_.closed = 1;
      if (o_.progress_fd >= 0 && absl::Now() - reported >= absl::Milliseconds(100)) {
        (void)!write(o_.progress_fd, &p_, sizeof(p_));
        reported = absl::Now();
      }
    }
    if (o_.progress_fd >= 0) (void)!write(o_.progress_fd, &p_, sizeof(p_));
    return p_;
  }

 private:
  struct Stream {
    int64_t window = 0;
    uint64_t left = 0;  // body bytes still to send (never the last one)
  };

  void ReadAll() {
    char buf[65536];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) p_.closed = 1;
      if (n <= 0) break;
      in_.append(buf, static_cast<size_t>(n));
    }
    while (in_.size() >= 9) {
      const uint32_t len = (static_cast<uint8_t>(in_[0]) << 16) |
                           (static_cast<uint8_t>(in_[1]) << 8) | static_cast<uint8_t>(in_[2]);
      if (in_.size() < 9 + len) break;
      Frame(static_cast<uint8_t>(in_[3]), static_cast<uint8_t>(in_[4]), Be32(in_, 5) & 0x7fffffff,
            in_.substr(9, len));
      in_.erase(0, 9 + len);
    }
  }

  void Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
    if (type == kSettings && (flags & kAck) == 0) {
      for (size_t i = 0; i + 6 <= payload.size(); i += 6) {
        const uint16_t id =
            (static_cast<uint8_t>(payload[i]) << 8) | static_cast<uint8_t>(payload[i + 1]);
        if (id != 4) continue;  // INITIAL_WINDOW_SIZE: applies to every open stream
        const int64_t window = Be32(payload, i + 2);
        for (auto& [sid, st] : streams_) st.window += window - initial_window_;
        initial_window_ = window;
      }
      AppendFrame(&out_, kSettings, kAck, 0, "");
      settled_ = true;
    } else if (type == kPing && (flags & kAck) == 0) {
      AppendFrame(&out_, kPing, kAck, 0, payload);
    } else if (type == kWindowUpdate && payload.size() == 4) {
      const uint32_t inc = Be32(payload, 0) & 0x7fffffff;
      if (stream == 0) {
        window_ += inc;
      } else if (auto it = streams_.find(stream); it != streams_.end()) {
        it->second.window += inc;
      }
    } else if (type == kRstStream) {
      if (streams_.erase(stream) > 0) ++p_.refused;
    } else if (type == kGoaway) {
      p_.closed = 1;
    }
  }

  // Body for a stream the windows allow, or else a new stream.
  void Produce() {
    for (auto& [sid, st] : streams_) {
      const int64_t n =
          std::min<int64_t>({st.window, window_, 16384, static_cast<int64_t>(st.left)});
      if (n <= 0) continue;
      AppendFrame(&out_, kData, 0, sid, std::string(static_cast<size_t>(n), 'x'));
      st.window -= n;
      window_ -= n;
      st.left -= static_cast<uint64_t>(n);
      p_.bytes += static_cast<uint64_t>(n);
      return;
    }
    // A new stream only once the server's settings are known, and only with room for its
    // message prefix.
    if (!settled_ || window_ < 5 || p_.streams >= static_cast<uint64_t>(o_.streams)) return;
    const uint32_t sid = static_cast<uint32_t>(2 * p_.streams + 1);
    ++p_.streams;
    AppendFrame(&out_, kHeaders, kEndHeaders, sid, headers_);
    std::string prefix(5, '\0');
    for (int i = 0; i < 4; ++i) prefix[1 + i] = static_cast<char>(o_.message_bytes >> (24 - 8 * i));
    streams_[sid] = Stream{initial_window_ - 5, o_.message_bytes - 1};
    window_ -= 5;
    AppendFrame(&out_, kData, 0, sid, prefix);
  }

  void WriteSome() {
    const ssize_t n = send(fd_, out_.data(), out_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) out_.erase(0, static_cast<size_t>(n));
    if (n < 0 && errno != EAGAIN && errno != EINTR) p_.closed = 1;
  }

  const int fd_;
  const HoldOptions& o_;
  const std::string headers_;
  std::string in_, out_;
  int64_t initial_window_ = 65535;
  int64_t window_ = 65535;  // the connection's
  bool settled_ = false;    // the server's SETTINGS arrived
  std::map<uint32_t, Stream> streams_;
  HoldProgress p_;
};

// Reads frames until the trailers (HEADERS with END_STREAM) of `stream`; acknowledges the
// server's SETTINGS on the way. False when the connection ends first.
bool ReadUntilTrailers(int fd, uint32_t stream, std::string* in) {
  for (;;) {
    while (in->size() >= 9) {
      const uint32_t len = (static_cast<uint8_t>((*in)[0]) << 16) |
                           (static_cast<uint8_t>((*in)[1]) << 8) | static_cast<uint8_t>((*in)[2]);
      if (in->size() < 9 + len) break;
      const uint8_t type = static_cast<uint8_t>((*in)[3]), flags = static_cast<uint8_t>((*in)[4]);
      const uint32_t sid = Be32(*in, 5) & 0x7fffffff;
      in->erase(0, 9 + len);
      if (type == kSettings && (flags & kAck) == 0) {
        std::string ack;
        AppendFrame(&ack, kSettings, kAck, 0, "");
        if (!WriteAll(fd, ack)) return false;
      }
      if (type == kGoaway) return false;
      if (type == kHeaders && sid == stream && (flags & kEndStream) != 0) return true;
    }
    char buf[16384];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in->append(buf, static_cast<size_t>(n));
  }
}

// A connected stream socket to 127.0.0.1:`tcp_port` when it is set, else to `socket_path`; -1
// when it cannot connect (errno says why).
int ConnectTo(const std::string& socket_path, int tcp_port) {
  const int fd = socket(tcp_port != 0 ? AF_INET : AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc = -1;
  if (fd >= 0 && tcp_port != 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(tcp_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else if (fd >= 0) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

}  // namespace

uint64_t CallEveryIntervalReadingEachAnswer(const PacedOptions& o) {
  signal(SIGPIPE, SIG_IGN);
  const int fd = ConnectTo(o.socket_path, 0);
  if (fd < 0) return 0;
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  AppendFrame(&out, kSettings, 0, 0, "");
  const std::string headers = HeaderBlock(o.method);
  std::string body(5, '\0');
  const uint32_t size = static_cast<uint32_t>(o.message.size());
  for (int i = 0; i < 4; ++i) body[1 + i] = static_cast<char>(size >> (24 - 8 * i));
  body += o.message;
  std::string in;
  uint64_t answered = 0;
  for (int call = 0; call < o.calls; ++call) {
    const uint32_t stream = static_cast<uint32_t>(2 * call + 1);
    AppendFrame(&out, kHeaders, kEndHeaders, stream, headers);
    AppendFrame(&out, kData, kEndStream, stream, body);
    if (!WriteAll(fd, out) || !ReadUntilTrailers(fd, stream, &in)) break;
    out.clear();
    ++answered;
    std::string ping;
    AppendFrame(&ping, kPing, 0, 0, std::string(8, static_cast<char>(call)));
    if (!WriteAll(fd, ping)) break;
    if (o.progress_fd >= 0) (void)!write(o.progress_fd, &answered, sizeof(answered));
    absl::SleepFor(o.interval);
  }
  if (o.progress_fd >= 0) (void)!write(o.progress_fd, &answered, sizeof(answered));
  close(fd);
  return answered;
}

absl::StatusOr<HoldProgress> HoldUnfinishedMessages(const HoldOptions& o) {
  signal(SIGPIPE, SIG_IGN);
  const int fd = ConnectTo(o.socket_path, o.tcp_port);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  return Holder(fd, o).Run();  // fd stays open
}

absl::StatusOr<FloodProgress> FloodWithoutReading(const FloodOptions& o) {
  signal(SIGPIPE, SIG_IGN);
  FloodProgress progress;
  for (;;) {
    const int fd = ConnectTo(o.socket_path, o.tcp_port);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("connect ", o.socket_path, ": ", std::strerror(errno)));
    }
    ++progress.connections;
    if (FloodOne(fd, o, &progress) || !o.reconnect) return progress;  // fd stays open, unread
    close(fd);
  }
}

}  // namespace kvtier::testing
