#include "tests/integration/support/manual_session.h"

#include <grpcpp/grpcpp.h>

#include "kvtier/client.h"

namespace kvtier::testing {

v1::HeartbeatRequest ManualSession::Heartbeat() const {
  v1::HeartbeatRequest r;
  r.set_worker_id(reg.worker_id());
  r.set_session_secret(reg.session_secret());
  r.set_daemon_epoch(reg.daemon_epoch());
  return r;
}

v1::RegisterWorkerRequest SmallRegistration() {
  v1::RegisterWorkerRequest r;
  v1::ModelGeometry* g = r.mutable_geometry();
  g->set_num_layers(2);
  g->set_num_kv_heads(1);
  g->set_head_dim(64);
  g->set_element_bytes(4);
  g->set_page_tokens(16);
  g->set_layer_groups(1);
  r.set_t1_page_bytes(16384);
  r.set_t2_page_bytes(4608);
  return r;
}

absl::StatusOr<ManualSession> RegisterByHand(const std::string& address) {
  absl::StatusOr<v1::ChannelReply> hello = ChannelHello(address);
  if (!hello.ok()) return hello.status();
  v1::RegisterWorkerRequest r = SmallRegistration();
  r.set_channel_ticket(hello->ticket());
  ManualSession s;
  s.stub = v1::KvTier::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::Status st = s.stub->RegisterWorker(&ctx, r, &s.reg);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }
  return s;
}

}  // namespace kvtier::testing
