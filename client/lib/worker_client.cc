#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/extent_mapping.h"
#include "client/lib/kept_channel.h"
#include "core/status/status_macros.h"
#include "edge/memory_channel.h"
#include "edge/message_limits.h"
#include "edge/rpc_status.h"
#include "kvtier/client.h"
#include "kvtier/v1/kvtier.grpc.pb.h"

namespace kvtier {
namespace {

using internal::ExtentMapping;
using internal::KeptChannel;
using DriverPtr = std::shared_ptr<const edge::cuda::Driver>;

// Snapshot connections a client keeps on the memory channel: sequences whose snapshots are in
// flight at once each take one, up to this; past it a snapshot goes over gRPC.
constexpr int kSnapshotConnections = 4;

// While the daemon does not answer, heartbeats retry this often, so a session resumes within a
// fraction of a second of the daemon coming back.
constexpr absl::Duration kRetryInterval = absl::Milliseconds(100);

// The daemon says the session is gone: register again (lease expired, daemon restarted).
bool SessionLost(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound ||
         (s.code() == absl::StatusCode::kFailedPrecondition &&
          absl::StrContains(s.message(), "register again"));
}

bool Unreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

class WorkerClientImpl final : public WorkerClient {
 public:
  WorkerClientImpl(const ClientOptions& options, std::string socket_path, edge::DaemonUids daemon)
      : options_(options),
        socket_path_(std::move(socket_path)),
        channel_path_(edge::ChannelPathFor(socket_path_)),
        daemon_(std::move(daemon)),
        beats_(channel_path_, options.rpc_deadline, daemon_),
        snapshots_(channel_path_, options.rpc_deadline, daemon_, kSnapshotConnections),
        stub_(v1::KvTier::NewStub(MakeChannel(options.address))) {}

  // After losing the daemon, a fresh channel connects at once instead of waiting out the old
  // one's reconnect backoff.
  void NewChannel() {
    std::shared_ptr<v1::KvTier::Stub> stub = v1::KvTier::NewStub(MakeChannel(options_.address));
    absl::MutexLock lock(&mu_);
    stub_ = std::move(stub);
  }

  // A restarted daemon must be found again within a heartbeat or two, not after gRPC's default
  // reconnect backoff (up to two minutes). Message limits: what the largest plan any daemon
  // config allows needs, and the largest snapshot (checked per call against the daemon's own).
  static std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(static_cast<int>(edge::MaxReplyBytes()));
    args.SetMaxSendMessageSize(
        static_cast<int>(edge::MaxSnapshotBytes(edge::kMaxSnapshotEntriesCap)));
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }

  ~WorkerClientImpl() override {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    // Give the memory back now rather than when the lease runs out.
    v1::CloseWorkerRequest request;
    Sign(&request);
    CloseSession(request);
  }

  void CloseSession(const v1::CloseWorkerRequest& request) {
    v1::CloseWorkerResponse response;
    if (!request.session_secret().empty()) {
      (void)Call(&v1::KvTier::Stub::CloseWorker, request, &response);
    }
  }

  // Registers; where the daemon's CUDA VMM memory cannot be mapped here (no driver, a GPU that
  // cannot import it), registers again asking for memfd pools, unless the worker required CUDA
  // VMM (registration.pool_memory).
  absl::Status Register() {
    {
      // A new session's sequences are re-opened under new ids, which report anew.
      absl::MutexLock lock(&lengths_mu_);
      lengths_.clear();
    }
    const v1::PoolMemory asked = options_.registration.pool_memory();
    std::string vmm_error;
    absl::Status s = RegisterAs(FallenBack() ? v1::POOL_MEMORY_MEMFD : asked, &vmm_error);
    if (s.ok() || vmm_error.empty() || asked == v1::POOL_MEMORY_CUDA_VMM) return s;
    {
      absl::MutexLock lock(&mu_);
      fallback_reason_ = vmm_error;
    }
    return RegisterAs(v1::POOL_MEMORY_MEMFD, &vmm_error);
  }

  bool FallenBack() const {
    absl::MutexLock lock(&mu_);
    return !fallback_reason_.empty();
  }

  // The driver, loaded the first time a pool needs it (the load's error every time after).
  absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>> Cuda() {
    absl::MutexLock lock(&mu_);
    if (cuda_ == nullptr && cuda_error_.ok()) {
      absl::StatusOr<std::unique_ptr<edge::cuda::Driver>> loaded =
          edge::cuda::Driver::Load(options_.cuda_library);
      if (loaded.ok()) {
        cuda_ = *std::move(loaded);
      } else {
        cuda_error_ = loaded.status();
      }
    }
    if (cuda_ == nullptr) return cuda_error_;
    return cuda_;
  }

  // One registration asking for `want`. When a CUDA VMM pool cannot be reserved here,
  // `vmm_error` says why and the new session is closed again.
  absl::Status RegisterAs(v1::PoolMemory want, std::string* vmm_error) {
    // gRPC connects (and reconnects) by path: the socket must be the daemon's, in a directory
    // only the daemon may write, so that it stays the daemon's for the session.
    RETURN_IF_ERROR(edge::CheckDaemonSocketFile(socket_path_, daemon_));
    v1::ChannelRequest hello_request;
    hello_request.mutable_hello();
    ASSIGN_OR_RETURN(
        v1::ChannelReply hello,
        edge::ChannelCall(channel_path_, hello_request, nullptr, absl::Seconds(2), &daemon_));
    v1::RegisterWorkerRequest request = options_.registration;
    request.set_pid(getpid());
    request.set_channel_ticket(hello.ticket());
    request.set_pool_memory(want);
    v1::RegisterWorkerResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::RegisterWorker, request, &response));
    std::shared_ptr<ExtentMapping> ddr, compressed;
    for (const v1::PoolDescriptor& d : response.pools()) {
      const bool vmm = d.memory() == v1::POOL_MEMORY_CUDA_VMM;
      absl::StatusOr<std::shared_ptr<ExtentMapping>> mapping =
          ExtentMapping::Reserve(d, response.worker_id(), response.daemon_epoch(),
                                 vmm ? Cuda() : absl::StatusOr<DriverPtr>(nullptr));
      if (!mapping.ok() && vmm) {
        *vmm_error = std::string(mapping.status().message());
        v1::CloseWorkerRequest close;
        close.set_worker_id(response.worker_id());
        close.set_session_secret(response.session_secret());
        CloseSession(close);
      }
      if (!mapping.ok()) return mapping.status();
      // Checks the sealed header before anything relies on the pool.
      RETURN_IF_ERROR((*mapping)->Grow(0, channel_path_, response.session_secret(), daemon_));
      (d.kind() == v1::POOL_KIND_DDR ? ddr : compressed) = *std::move(mapping);
    }
    if (ddr == nullptr || compressed == nullptr) {
      return absl::InternalError("kvtierd described no DDR or no compressed pool");
    }
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    secret_ = response.session_secret();
    epoch_ = response.daemon_epoch();
    heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
    lease_ttl_ = absl::Milliseconds(response.lease_ttl_ms());
    max_snapshot_entries_ = response.max_snapshot_entries();
    ddr_ = std::move(ddr);
    compressed_ = std::move(compressed);
    ++generation_;
    connected_ = true;
    beats_.Retry();  // a new session may be a newer daemon's
    if (options_.snapshots_over_channel && hello.takes_snapshots()) {
      snapshots_.Retry();
    } else {
      snapshots_.Decline();
    }
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
    if (options_.heartbeat_priority > 0) {
      sched_param param{};
      param.sched_priority = options_.heartbeat_priority;
      heartbeat_realtime_ =
          pthread_setschedparam(heartbeat_thread_.native_handle(), SCHED_FIFO, &param) == 0;
    }
  }

  bool heartbeat_realtime() const override { return heartbeat_realtime_; }

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
  absl::Duration lease_ttl() const override {
    absl::MutexLock lock(&mu_);
    return lease_ttl_;
  }
  std::shared_ptr<PoolMapping> pool(v1::PoolKind kind) const override {
    absl::MutexLock lock(&mu_);
    return kind == v1::POOL_KIND_DDR ? ddr_ : compressed_;
  }

  absl::StatusOr<uint64_t> OpenSequence(uint64_t prompt_tokens, const v1::PolicyConfig& policy,
                                        const std::string& tag, uint64_t length,
                                        uint64_t protected_prompt_begin) override {
    v1::OpenSequenceRequest request;
    Sign(&request);
    request.set_prompt_tokens(prompt_tokens);
    request.set_length(length);
    request.set_protected_prompt_begin(protected_prompt_begin);
    *request.mutable_policy() = policy;
    request.set_tag(tag);
    v1::OpenSequenceResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::OpenSequence, request, &response));
    return response.sequence_id();
  }

  absl::StatusOr<v1::TierPlan> SubmitSnapshot(v1::SubmitSnapshotRequest snapshot) override {
    const uint64_t signed_as = Sign(&snapshot);
    const uint64_t entries = static_cast<uint64_t>(snapshot.page_scores_size());
    {
      absl::MutexLock lock(&mu_);
      if (max_snapshot_entries_ > 0 && entries > max_snapshot_entries_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "snapshot of ", entries, " entries exceeds the daemon's limits.max_snapshot_entries (",
            max_snapshot_entries_, ")"));
      }
    }
    v1::TierPlan plan;
    std::optional<absl::Status> sent = internal::ChannelSnapshot(snapshots_, snapshot, &plan);
    if (sent) Track(*sent);
    RETURN_IF_ERROR(sent ? *sent : Call(&v1::KvTier::Stub::SubmitSnapshot, snapshot, &plan));
    // The plan's slots may lie in extents this process has not mapped yet.
    absl::Status mapped = MapExtentsFor(plan);
    if (!mapped.ok()) {
      (void)AckPlan(plan.sequence_id(), plan.plan_version(), false,
                    absl::StrCat("cannot map the plan's extents: ", mapped.message()));
      return FallBackIfVmmFailed(mapped, signed_as);
    }
    return plan;
  }

  absl::Status AckPlan(uint64_t sequence_id, uint64_t plan_version, bool applied,
                       const std::string& error) override {
    v1::AckPlanRequest request;
    Sign(&request);
    request.set_sequence_id(sequence_id);
    request.set_plan_version(plan_version);
    request.set_applied(applied);
    request.set_error(error);
    v1::AckPlanResponse response;
    return Call(&v1::KvTier::Stub::AckPlan, request, &response);
  }

  absl::Status CloseSequence(uint64_t sequence_id) override {
    v1::CloseSequenceRequest request;
    Sign(&request);
    request.set_sequence_id(sequence_id);
    {
      absl::MutexLock lock(&lengths_mu_);
      lengths_.erase(sequence_id);
    }
    v1::CloseSequenceResponse response;
    return Call(&v1::KvTier::Stub::CloseSequence, request, &response);
  }

  absl::StatusOr<v1::GetStatusResponse> GetStatus(bool workers, bool sequences) override {
    v1::GetStatusRequest request;
    Sign(&request);
    request.set_include_workers(workers);
    request.set_include_sequences(sequences);
    v1::GetStatusResponse response;
    RETURN_IF_ERROR(Call(&v1::KvTier::Stub::GetStatus, request, &response));
    return response;
  }

  std::string pool_fallback_reason() const override {
    absl::MutexLock lock(&mu_);
    return fallback_reason_;
  }

  void ReportStepSeconds(double seconds) override {
    step_seconds_.store(std::isfinite(seconds) ? std::clamp(seconds, 0.0, 600.0) : 0.0);
  }

  void ReportSequenceLength(uint64_t sequence_id, uint64_t length) override {
    absl::MutexLock lock(&lengths_mu_);
    lengths_[sequence_id] = length;
  }

  absl::Status HeartbeatOnce() override {
    v1::HeartbeatRequest request;
    const uint64_t signed_as = Sign(&request);
    if (!connected() && signed_as == 0) return RegisterAgain(0);
    request.set_step_seconds(step_seconds_.load());
    {
      absl::MutexLock lock(&lengths_mu_);
      for (const auto& [id, length] : lengths_) {
        v1::SequenceSize* size = request.add_sequences();
        size->set_sequence_id(id);
        size->set_length(length);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      request.set_daemon_epoch(epoch_);
    }
    v1::HeartbeatResponse response;
    std::optional<absl::Status> beat;
    if (options_.heartbeat_over_channel)
      beat = internal::ChannelHeartbeat(beats_, request, &response);
    if (beat) Track(*beat);
    absl::Status s = beat ? *beat : Call(&v1::KvTier::Stub::Heartbeat, request, &response);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      lease_ttl_ = absl::Milliseconds(response.lease_ttl_ms());
      if (response.heartbeat_interval_ms() > 0) {
        heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
      }
      return s;
    }
    // Lost only when the daemon says so; a daemon that does not answer keeps the session (it
    // resumes once the daemon answers, as long as the lease lives).
    if (SessionLost(s)) s = RegisterAgain(signed_as);
    // The daemon went away, or is back so soon that its channel answers while the gRPC channel
    // still backs off (RegisterWorker refused): a fresh channel connects at once.
    if (s.code() == absl::StatusCode::kUnavailable) NewChannel();
    return s;
  }

 private:
  // Returns the generation of the session the request speaks for.
  template <typename Request>
  uint64_t Sign(Request* request) const {
    absl::MutexLock lock(&mu_);
    request->set_worker_id(worker_id_);
    request->set_session_secret(secret_);
    return generation_;
  }

  // Registers again after the session of generation `lost` ended. The threads that find it gone
  // at once (heartbeats, a plan that fell back) open one new session between them: two would
  // leave one unclosed, its memory held until its lease ran out.
  absl::Status RegisterAgain(uint64_t lost) {
    absl::MutexLock lock(&register_mu_);
    if (generation() != lost) return absl::OkStatus();
    return Register();
  }

  // A CUDA VMM extent that cannot be imported or mapped here: the session ends and the worker
  // registers again with memfd pools (a new generation: its sequences are re-opened as after a
  // daemon restart). Pages already in the old pools stay mapped for as long as they are held.
  absl::Status FallBackIfVmmFailed(const absl::Status& mapped, uint64_t signed_as) {
    absl::MutexLock register_lock(&register_mu_);
    if (generation() != signed_as) return mapped;  // another thread registered again already
    std::string failure;
    {
      absl::MutexLock lock(&mu_);
      failure = ddr_->vmm_failure();
      if (failure.empty()) failure = compressed_->vmm_failure();
    }
    if (failure.empty() || options_.registration.pool_memory() == v1::POOL_MEMORY_CUDA_VMM) {
      return mapped;
    }
    v1::CloseWorkerRequest close;
    Sign(&close);
    {
      absl::MutexLock lock(&mu_);
      fallback_reason_ = failure;
    }
    CloseSession(close);
    absl::Status again = Register();
    return absl::Status(
        mapped.code(),
        absl::StrCat(mapped.message(), again.ok() ? "; registered again with memfd pools"
                                                  : absl::StrCat("; registering again "
                                                                 "with memfd pools: ",
                                                                 again.message())));
  }

  absl::Status MapExtentsFor(const v1::TierPlan& plan) {
    std::shared_ptr<ExtentMapping> ddr, compressed;
    std::string secret;
    {
      absl::MutexLock lock(&mu_);
      ddr = ddr_;
      compressed = compressed_;
      secret = secret_;
    }
    if (ddr->mapped_extents() < plan.ddr_extents()) {
      RETURN_IF_ERROR(ddr->Grow(plan.ddr_extents(), channel_path_, secret, daemon_));
    }
    if (compressed->mapped_extents() < plan.compressed_extents()) {
      RETURN_IF_ERROR(compressed->Grow(plan.compressed_extents(), channel_path_, secret, daemon_));
    }
    return absl::OkStatus();
  }

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
    absl::Status s = edge::FromGrpcStatus(((*stub).*method)(&ctx, request, response));
    Track(s);
    return s;
  }

  // Notes what a call's status says of the connection to the daemon.
  void Track(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (Unreachable(s) || SessionLost(s)) {
      connected_ = false;
    } else if (s.ok()) {
      connected_ = true;
    }
  }

  absl::Duration HeartbeatInterval() const {
    absl::MutexLock lock(&mu_);
    if (!connected_) return kRetryInterval;
    absl::Duration d =
        heartbeat_interval_ > absl::ZeroDuration() ? heartbeat_interval_ : absl::Seconds(1);
    // Never let the lease run out between two heartbeats, whatever the daemon suggested.
    if (lease_ttl_ > absl::ZeroDuration()) d = std::min(d, lease_ttl_ / 3);
    return d;
  }

  const ClientOptions options_;
  const std::string socket_path_;
  const std::string channel_path_;
  const edge::DaemonUids daemon_;  // who may answer on socket_path_ and channel_path_
  KeptChannel beats_;              // kept channel connections (options_.heartbeat_over_channel,
  KeptChannel snapshots_;          // options_.snapshots_over_channel)
  absl::Mutex register_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one re-registration at a time
  mutable absl::Mutex mu_;
  std::shared_ptr<v1::KvTier::Stub> stub_ ABSL_GUARDED_BY(mu_);
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::string secret_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_snapshot_entries_ ABSL_GUARDED_BY(mu_) = 0;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Duration lease_ttl_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::shared_ptr<ExtentMapping> ddr_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ExtentMapping> compressed_ ABSL_GUARDED_BY(mu_);
  std::string fallback_reason_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const edge::cuda::Driver> cuda_ ABSL_GUARDED_BY(mu_);
  absl::Status cuda_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<double> step_seconds_{0};
  // ReportSequenceLength's figures, by sequence id, for the heartbeats.
  absl::Mutex lengths_mu_;
  absl::flat_hash_map<uint64_t, uint64_t> lengths_ ABSL_GUARDED_BY(lengths_mu_);
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread heartbeat_thread_;
  std::atomic<bool> heartbeat_realtime_{false};
};

}  // namespace

absl::StatusOr<v1::ChannelReply> ChannelHello(const std::string& address, int64_t daemon_uid) {
  ASSIGN_OR_RETURN(std::string socket_path, edge::UnixSocketPath(address));
  ASSIGN_OR_RETURN(edge::DaemonUids daemon, edge::ResolveDaemonUids(daemon_uid));
  v1::ChannelRequest request;
  request.mutable_hello();
  return edge::ChannelCall(edge::ChannelPathFor(socket_path), request, nullptr, absl::Seconds(2),
                           &daemon);
}

absl::StatusOr<std::unique_ptr<WorkerClient>> WorkerClient::Connect(const ClientOptions& options) {
  if (options.heartbeat_priority < 0 || options.heartbeat_priority > 99) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_priority is ", options.heartbeat_priority,
                     "; expected 0 (off) or a SCHED_FIFO priority, 1-99"));
  }
  ASSIGN_OR_RETURN(std::string socket_path, edge::UnixSocketPath(options.address));
  ASSIGN_OR_RETURN(edge::DaemonUids daemon, edge::ResolveDaemonUids(options.daemon_uid));
  auto client = std::make_unique<WorkerClientImpl>(options, socket_path, std::move(daemon));
  RETURN_IF_ERROR(client->Register());
  if (options.background_heartbeat) client->StartHeartbeats();
  return std::unique_ptr<WorkerClient>(std::move(client));
}

}  // namespace kvtier
