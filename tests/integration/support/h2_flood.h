#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_H2_FLOOD_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_H2_FLOOD_H_

// A client that stops reading: it speaks just enough HTTP/2 to send gRPC unary requests over a
// unix socket and never reads a byte of what comes back (no SETTINGS ack, no PING answer, no
// WINDOW_UPDATE: the daemon's answers pile up on its side). The misbehaving peer of the
// stuck-client tests. Stateless; call in a process of its own.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

// What a flood reports after each batch (whole, below PIPE_BUF).
struct FloodProgress {
  uint64_t connections = 0;  // made so far
  uint64_t streams = 0;      // requests sent so far, over all of them
};

struct FloodOptions {
  std::string socket_path;  // kvtierd's gRPC unix socket; or
  int tcp_port = 0;         // its TCP port on 127.0.0.1
  std::string method = "/kvtier.v1.KvTier/GetStatus";
  std::string message;               // serialized request, sent on every stream
  uint64_t max_streams = 1'000'000;  // per connection: stream ids 1, 3, 5, ... (below 2^31)
  bool reconnect = false;            // connect again whenever the daemon drops the connection
  absl::Duration pause;              // between batches of 64 requests (zero: none)
  int progress_fd = -1;              // gets a FloodProgress after every batch
};

// Connects, sends the connection preface and an empty SETTINGS frame, then one request per
// stream (HEADERS + DATA with END_STREAM) as fast as the socket takes them. Returns what it did
// once max_streams are out on one connection, or when the daemon drops it (unless `reconnect`);
// UNAVAILABLE when it cannot connect. Blocks while the daemon does not read. The last
// connection stays open, unread, until the process exits.
absl::StatusOr<FloodProgress> FloodWithoutReading(const FloodOptions& options);

// The other misbehaving peer: it reads everything (acknowledges SETTINGS, answers PINGs,
// honours flow control) and opens stream after stream, each a request whose gRPC prefix
// announces `message_bytes` and whose body it sends as far as the daemon's windows allow,
// never finishing one. A server with no stream or memory bound buffers all of them.
struct HoldOptions {
  std::string socket_path;  // kvtierd's gRPC unix socket; or
  int tcp_port = 0;         // its TCP port on 127.0.0.1
  std::string method = "/kvtier.v1.KvTier/SubmitSnapshot";
  uint32_t message_bytes = 10u << 20;
  int streams = 256;  // opened at most
  absl::Duration duration = absl::Seconds(10);
  int progress_fd = -1;  // gets a HoldProgress every 100 ms
};

struct HoldProgress {
  uint64_t streams = 0;  // opened
  uint64_t refused = 0;  // reset by the server
  uint64_t bytes = 0;    // of message bodies sent
  uint64_t closed = 0;   // 1 once the server closed the connection
};

// Runs for `duration` (or until the server closes the connection); the connection then stays
// open until the process exits. UNAVAILABLE when it cannot connect.
absl::StatusOr<HoldProgress> HoldUnfinishedMessages(const HoldOptions& options);

// A client that reads every answer: it sends one request (`message` to `method`), reads until
// that call's trailers, then sends a PING (as gRPC's client does after data, to measure the
// link) and waits `interval` without reading, so the PING's answer stays unread until its next
// call: at any instant between calls the same 17 bytes are unread, different bytes each time.
// Reports the calls answered so far (uint64_t) to `progress_fd` after each; returns them once
// `calls` are done, or when the daemon drops the connection.
struct PacedOptions {
  std::string socket_path;
  std::string method = "/kvtier.v1.KvTier/GetStatus";
  std::string message;
  int calls = 16;
  absl::Duration interval = absl::Milliseconds(250);
  int progress_fd = -1;
};
uint64_t CallEveryIntervalReadingEachAnswer(const PacedOptions& options);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_H2_FLOOD_H_
