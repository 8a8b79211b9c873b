#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/rpc/rpc_status.h"
#include "core/status/status_macros.h"
#include "kvtier/client.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier {
namespace {

class WorkerClientImpl final : public WorkerClient {
 public:
  explicit WorkerClientImpl(const ClientOptions& options)
      : options_(options), stub_(v1::KvTier::NewStub(MakeChannel(options.address))) {}

  // After losing the daemon, a fresh channel connects at once instead of waiting out the old
  // one's reconnect backoff.
  void NewChannel() {
    std::shared_ptr<v1::KvTier::Stub> stub = v1::KvTier::NewStub(MakeChannel(options_.address));
    absl::MutexLock lock(&mu_);
    stub_ = std::move(stub);
  }

  // A restarted daemon must be found again within a heartbeat or two, not after gRPC's default
  // reconnect backoff (up to two minutes).
  static std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }

  ~WorkerClientImpl() override {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }

  absl::Status Register() {
    v1::RegisterWorkerRequest request = options_.registration;
    request.set_pid(getpid());
    v1::RegisterWorkerResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::RegisterWorker, request, &response));
    std::shared_ptr<PoolMapping> ddr, compressed;
    for (const v1::PoolDescriptor& d : response.pools()) {
      ASSIGN_OR_RETURN(std::shared_ptr<PoolMapping> mapping, MapPool(d));
      (d.kind() == v1::POOL_KIND_DDR ? ddr : compressed) = std::move(mapping);
    }
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    epoch_ = response.daemon_epoch();
    heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
    ddr_ = std::move(ddr);
    compressed_ = std::move(compressed);
    ++generation_;
    connected_ = true;
    return absl::OkStatus();
  }

  void StartHeartbeats() {
    heartbeat_thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(stop_mu_);
      while (!stop_) {
        auto period = absl::ToChronoMilliseconds(HeartbeatInterval());
        if (stop_cv_.wait_for(lock, period, [this] { return stop_; })) break;
        lock.unlock();
        (void)HeartbeatOnce();
        lock.lock();
      }
    });
  }

  uint64_t worker_id() const override {
    absl::MutexLock lock(&mu_);
    return worker_id_;
  }
  uint64_t generation() const override {
    absl::MutexLock lock(&mu_);
    return generation_;
  }
  bool connected() const override {
    absl::MutexLock lock(&mu_);
    return connected_;
  }
  std::shared_ptr<PoolMapping> pool(v1::PoolKind kind) const override {
    absl::MutexLock lock(&mu_);
    return kind == v1::POOL_KIND_DDR ? ddr_ : compressed_;
  }

  absl::StatusOr<uint64_t> OpenSequence(uint64_t prompt_tokens, const v1::PolicyConfig& policy,
                                        const std::string& tag) override {
    v1::OpenSequenceRequest request;
    request.set_worker_id(worker_id());
    request.set_prompt_tokens(prompt_tokens);
    *request.mutable_policy() = policy;
    request.set_tag(tag);
    v1::OpenSequenceResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::OpenSequence, request, &response));
    return response.sequence_id();
  }

  absl::StatusOr<v1::TierPlan> SubmitSnapshot(v1::SubmitSnapshotRequest snapshot) override {
    snapshot.set_worker_id(worker_id());
    v1::TierPlan plan;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::SubmitSnapshot, snapshot, &plan));
    return plan;
  }

  absl::Status AckPlan(uint64_t sequence_id, uint64_t plan_version, bool applied,
                       const std::string& error) override {
    v1::AckPlanRequest request;
    request.set_worker_id(worker_id());
    request.set_sequence_id(sequence_id);
    request.set_plan_version(plan_version);
    request.set_applied(applied);
    request.set_error(error);
    v1::AckPlanResponse response;
    return Call(&v1::KvTier::Stub::AckPlan, request, &response);
  }

  absl::Status CloseSequence(uint64_t sequence_id) override {
    v1::CloseSequenceRequest request;
    request.set_worker_id(worker_id());
    request.set_sequence_id(sequence_id);
    v1::CloseSequenceResponse response;
    return Call(&v1::KvTier::Stub::CloseSequence, request, &response);
  }

  absl::StatusOr<v1::GetStatusResponse> GetStatus(bool workers, bool sequences) override {
    v1::GetStatusRequest request;
    request.set_include_workers(workers);
    request.set_include_sequences(sequences);
    v1::GetStatusResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::GetStatus, request, &response));
    return response;
  }

  absl::Status HeartbeatOnce() override {
    if (!connected()) {
      NewChannel();
      return Register();
    }
    v1::HeartbeatRequest request;
    {
      absl::MutexLock lock(&mu_);
      request.set_worker_id(worker_id_);
      request.set_daemon_epoch(epoch_);
    }
    v1::HeartbeatResponse response;
    absl::Status s = Call(&v1::KvTier::Stub::Heartbeat, request, &response);
    if (s.ok()) return s;
    // Lease lost or daemon restarted (FAILED_PRECONDITION / NOT_FOUND), or unreachable: try to
    // register again right away; until that works the worker runs on its own.
    return Register();
  }

 private:
  template <typename Request, typename Response>
  using Method = grpc::Status (v1::KvTier::Stub::*)(grpc::ClientContext*, const Request&,
                                                    Response*);

  template <typename Request, typename Response>
  absl::Status Call(Method<Request, Response> method, const Request& request, Response* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_deadline));
    std::shared_ptr<v1::KvTier::Stub> stub;
    {
      absl::MutexLock lock(&mu_);
      stub = stub_;
    }
    absl::Status s = rpc::FromGrpcStatus(((*stub).*method)(&ctx, request, response));
    if (s.code() == absl::StatusCode::kUnavailable ||
        s.code() == absl::StatusCode::kDeadlineExceeded ||
        (s.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(s.message(), "register"))) {
      absl::MutexLock lock(&mu_);
      connected_ = false;
    }
    return s;
  }

  absl::Duration HeartbeatInterval() const {
    absl::MutexLock lock(&mu_);
    return heartbeat_interval_ > absl::ZeroDuration() ? heartbeat_interval_ : absl::Seconds(1);
  }

  const ClientOptions options_;
  std::shared_ptr<v1::KvTier::Stub> stub_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex mu_;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::shared_ptr<PoolMapping> ddr_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PoolMapping> compressed_ ABSL_GUARDED_BY(mu_);
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread heartbeat_thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerClient>> WorkerClient::Connect(const ClientOptions& options) {
  auto client = std::make_unique<WorkerClientImpl>(options);
  RETURN_IF_ERROR(client->Register());
  if (options.background_heartbeat) client->StartHeartbeats();
  return std::unique_ptr<WorkerClient>(std::move(client));
}

}  // namespace kvtier
