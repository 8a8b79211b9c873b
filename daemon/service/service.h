#ifndef KVTIER_DAEMON_SERVICE_SERVICE_H_
#define KVTIER_DAEMON_SERVICE_SERVICE_H_

#include <memory>

#include "daemon/config/config.h"
#include "daemon/daemon_core.h"
#include "daemon/service/policy_lane.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier::daemon {

// The gRPC face of DaemonCore: proto in, one call into the core, proto out. Never blocks a
// reactor thread beyond the core's own short critical sections: snapshots, whose policy run is
// the one long request, are answered from the policy lane (policy_lane.h). Thread-safe.
class KvTierService final : public v1::KvTier::CallbackService {
 public:
  // `core` must outlive the service. `defaults` fill OpenSequence requests naming no policy.
  // `policy_threads` run snapshots (0: on gRPC's own callback threads).
  KvTierService(DaemonCore* core, PolicyDefaults defaults, int policy_threads = 2)
      : core_(core),
        defaults_(defaults),
        lane_(policy_threads > 0 ? std::make_unique<PolicyLane>(policy_threads) : nullptr) {}

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
  // Declared last: destroyed first, finishing the snapshots still queued.
  const std::unique_ptr<PolicyLane> lane_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SERVICE_SERVICE_H_
