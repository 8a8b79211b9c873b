#include "daemon/service/service.h"

#include <cmath>

#include "edge/rpc_status.h"

namespace kvtier::daemon {
namespace {

template <typename Response>
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, absl::StatusOr<Response> result,
                                 Response* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(edge::ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* KvTierService::RegisterWorker(grpc::CallbackServerContext* ctx,
                                                        const v1::RegisterWorkerRequest* request,
                                                        v1::RegisterWorkerResponse* response) {
  return Finish(ctx, core_->RegisterWorker(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                   const v1::HeartbeatRequest* request,
                                                   v1::HeartbeatResponse* response) {
  return Finish(ctx, core_->Heartbeat(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::OpenSequence(grpc::CallbackServerContext* ctx,
                                                      const v1::OpenSequenceRequest* request,
                                                      v1::OpenSequenceResponse* response) {
  if (!request->has_policy() || request->policy().name().empty()) {
    v1::OpenSequenceRequest filled = *request;
    v1::PolicyConfig* policy = filled.mutable_policy();
    policy->set_name(defaults_.name);
    policy->set_hbm_ratio(defaults_.hbm_ratio);
    policy->set_evict_ratio(defaults_.evict_ratio);
    policy->set_compress_ratio(defaults_.compress_ratio);
    if (std::isfinite(defaults_.max_lost_mass)) policy->set_max_lost_mass(defaults_.max_lost_mass);
    return Finish(ctx, core_->OpenSequence(filled), response);
  }
  return Finish(ctx, core_->OpenSequence(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::SubmitSnapshot(grpc::CallbackServerContext* ctx,
                                                        const v1::SubmitSnapshotRequest* request,
                                                        v1::TierPlan* response) {
  if (lane_ == nullptr) return Finish(ctx, core_->SubmitSnapshot(*request), response);
  // The request and response stay valid until the reactor finishes.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  lane_->Schedule([this, reactor, request, response] {
    absl::StatusOr<v1::TierPlan> plan = core_->SubmitSnapshot(*request);
    if (plan.ok()) *response = *std::move(plan);
    reactor->Finish(edge::ToGrpcStatus(plan.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* KvTierService::AckPlan(grpc::CallbackServerContext* ctx,
                                                 const v1::AckPlanRequest* request,
                                                 v1::AckPlanResponse* response) {
  return Finish(ctx, core_->AckPlan(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::CloseSequence(grpc::CallbackServerContext* ctx,
                                                       const v1::CloseSequenceRequest* request,
                                                       v1::CloseSequenceResponse* response) {
  return Finish(ctx, core_->CloseSequence(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::CloseWorker(grpc::CallbackServerContext* ctx,
                                                     const v1::CloseWorkerRequest* request,
                                                     v1::CloseWorkerResponse* response) {
  return Finish(ctx, core_->CloseWorker(*request), response);
}

grpc::ServerUnaryReactor* KvTierService::GetStatus(grpc::CallbackServerContext* ctx,
                                                   const v1::GetStatusRequest* request,
                                                   v1::GetStatusResponse* response) {
  return Finish(ctx, core_->GetStatus(*request), response);
}

}  // namespace kvtier::daemon
