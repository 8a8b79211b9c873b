#ifndef KVTIER_DAEMON_KVTIERD_METRICS_SERVER_H_
#define KVTIER_DAEMON_KVTIERD_METRICS_SERVER_H_

// kvtierd's HTTP endpoint on server.metrics: Prometheus' `/metrics` (the text exposition of the
// registry, as prometheus-cpp's Exposer serves it) and the status page at `/`
// (daemon/kvtierd/status_page.h). civetweb, the server prometheus-cpp's Exposer is made of, with
// the two handlers; anything else is 404. Thread-safe.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

class CivetServer;

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace kvtier::daemon {

class MetricsServer {
 public:
  using PageSource = std::function<std::string()>;

  // Listens on `address` (host:port; port 0 = any free port) with two threads. UNAVAILABLE with
  // civetweb's reason when it cannot (a port in use).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();

  // What `/` serves; null: 503 "starting". Setting it waits for pages being rendered with the
  // previous one, so that a source that goes away can be unset first.
  void SetStatusPage(PageSource page);
  std::vector<int> ListeningPorts() const;

 private:
  class Handler;  // one per path: /metrics, / (and the 404s under it)
  MetricsServer() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex page_mu_;
  PageSource page_ ABSL_GUARDED_BY(page_mu_);
  std::unique_ptr<Handler> metrics_handler_, page_handler_;
  std::unique_ptr<CivetServer> server_;  // last: stopped first, before the handlers go
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_METRICS_SERVER_H_
