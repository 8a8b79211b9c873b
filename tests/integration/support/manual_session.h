#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_MANUAL_SESSION_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_MANUAL_SESSION_H_

// A worker session registered by hand against a running kvtierd, so that a test holds what the
// client library keeps private: the session secret, to send requests of its own making.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::testing {

struct ManualSession {
  std::shared_ptr<v1::KvTier::Stub> stub;
  v1::RegisterWorkerResponse reg;

  // A heartbeat of this session (id, secret, epoch).
  v1::HeartbeatRequest Heartbeat() const;
};

// A small worker's registration: 2 layers, 1 KV head, head_dim 64, fp32, 16-token pages.
v1::RegisterWorkerRequest SmallRegistration();

// Says hello on the memory channel beside `address` ("unix:PATH") and registers
// SmallRegistration() with the ticket.
absl::StatusOr<ManualSession> RegisterByHand(const std::string& address);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_MANUAL_SESSION_H_
