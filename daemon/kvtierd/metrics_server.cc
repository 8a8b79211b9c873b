#include "daemon/kvtierd/metrics_server.h"

#include <CivetServer.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::daemon {

// One handler object per path; the server's threads call it concurrently.
class MetricsServer::Handler : public CivetHandler {
 public:
  Handler(MetricsServer* owner, bool metrics) : owner_(owner), metrics_(metrics) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* info = mg_get_request_info(conn);
    const char* uri = info != nullptr && info->local_uri != nullptr ? info->local_uri : "";
    if (metrics_) {
      Send(conn, "text/plain; version=0.0.4; charset=utf-8",
           prometheus::TextSerializer().Serialize(owner_->registry_->Collect()));
      return true;
    }
    // Registered at "/", civetweb hands this handler every path no other matches.
    if (std::strcmp(uri, "/") != 0 && std::strcmp(uri, "/index.html") != 0) {
      mg_send_http_error(conn, 404, "%s", "not found: kvtierd serves / and /metrics\n");
      return true;
    }
    absl::ReaderMutexLock lock(&owner_->page_mu_);
    if (!owner_->page_) {
      mg_send_http_error(conn, 503, "%s", "kvtierd is starting\n");
      return true;
    }
    Send(conn, "text/html; charset=utf-8", owner_->page_());
    return true;
  }

 private:
  static void Send(mg_connection* conn, const char* type, const std::string& body) {
    mg_send_http_ok(conn, type, static_cast<long long>(body.size()));
    mg_write(conn, body.data(), body.size());
  }
  MetricsServer* const owner_;
  const bool metrics_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  server->registry_ = std::move(registry);
  server->metrics_handler_ = std::make_unique<Handler>(server.get(), true);
  server->page_handler_ = std::make_unique<Handler>(server.get(), false);
  try {
    server->server_ = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", address, "num_threads", "2"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(e.what());  // the caller names the address
  }
  server->server_->addHandler("/metrics", server->metrics_handler_.get());
  server->server_->addHandler("/", server->page_handler_.get());
  return server;
}

MetricsServer::~MetricsServer() { server_.reset(); }

void MetricsServer::SetStatusPage(PageSource page) {
  absl::MutexLock lock(&page_mu_);
  page_ = std::move(page);
}

std::vector<int> MetricsServer::ListeningPorts() const { return server_->getListeningPorts(); }

}  // namespace kvtier::daemon
