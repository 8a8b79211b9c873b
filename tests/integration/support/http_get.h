#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_HTTP_GET_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_HTTP_GET_H_

// A minimal HTTP/1.0 GET client for loopback test servers (Prometheus, kvtierd's /metrics):
// one request per connection, no redirects, no chunked encoding (HTTP/1.0 answers have none).
// Stateless; thread-safe.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::testing {

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET http://127.0.0.1:<port><target>; `target` is the path and query, already encoded.
// UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED past `timeout`.
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target,
                                     absl::Duration timeout = absl::Seconds(5));

// Percent-encodes `text` for a query-string value (RFC 3986 unreserved characters stay).
std::string UrlEncode(std::string_view text);

// One metric from a Prometheus /metrics page on `port`, summed over its label sets; `name` may
// carry labels (`kvtier_pool_used_bytes{tier="T1"}`) to pick one. -1 when the page is not there.
double ScrapeMetric(int port, const std::string& name);

// ScrapeMetric until the value reaches `at_least` or `timeout` passes; returns the last value
// (a daemon may count an event a moment after its answer went out).
double WaitForMetric(int port, const std::string& name, double at_least,
                     absl::Duration timeout = absl::Seconds(3));

// A loopback TCP port that was free a moment ago (bound to port 0, then released).
absl::StatusOr<int> FreeLoopbackPort();

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_HTTP_GET_H_
