#ifndef KVTIER_DAEMON_SERVICE_SERVICE_H_
#define KVTIER_DAEMON_SERVICE_SERVICE_H_

#include "daemon/config/config.h"
#include "daemon/daemon_core.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::daemon {

// The gRPC face of DaemonCore: proto in, one call into the core, proto out. Never blocks a
// reactor thread beyond the core's own short critical sections. Thread-safe.
class KvTierService final : public v1::KvTier::CallbackService {
 public:
  // `core` must outlive the service. `defaults` fill OpenSequence requests naming no policy.
  KvTierService(DaemonCore* core, PolicyDefaults defaults) : core_(core), defaults_(defaults) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* OpenSequence(grpc::CallbackServerContext* ctx,
                                         const v1::OpenSequenceRequest* request,
                                         v1::OpenSequenceResponse* response) override;
  grpc::ServerUnaryReactor* SubmitSnapshot(grpc::CallbackServerContext* ctx,
                                           const v1::SubmitSnapshotRequest* request,
                                           v1::TierPlan* response) override;
  grpc::ServerUnaryReactor* AckPlan(grpc::CallbackServerContext* ctx,
                                    const v1::AckPlanRequest* request,
                                    v1::AckPlanResponse* response) override;
  grpc::ServerUnaryReactor* CloseSequence(grpc::CallbackServerContext* ctx,
                                          const v1::CloseSequenceRequest* request,
                                          v1::CloseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* CloseWorker(grpc::CallbackServerContext* ctx,
                                        const v1::CloseWorkerRequest* request,
                                        v1::CloseWorkerResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;

 private:
  DaemonCore* const core_;
  const PolicyDefaults defaults_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SERVICE_SERVICE_H_
