#include "daemon/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"

namespace kvtier::daemon {
namespace {

using tiering::MoveKind;
using tiering::Tier;

constexpr int kNumMoveKinds = 5;
constexpr std::array<absl::string_view, kNumMoveKinds> kMoveKindNames = {
    "offload", "compress", "promote", "decompress", "evict"};
constexpr std::array<absl::string_view, 3> kDegradeNames = {"ddr_full", "compressed_full", "quota"};
constexpr std::array<absl::string_view, 2> kAllocFailureNames = {"pool_full", "quota"};
constexpr std::array<absl::string_view, 16> kDropNames = {
    "grpc_unread",      "heartbeat_unread",    "heartbeat_too_fast",  "heartbeat_refused",
    "heartbeat_misuse", "heartbeat_lane_full", "snapshot_unread",     "snapshot_refused",
    "snapshot_misuse",  "snapshot_lane_full",  "channel_descriptors", "channel_deadline",
    "channel_uid_full", "channel_full",        "grpc_over_cap",       "grpc_no_descriptor"};
static_assert(kDropNames.size() == static_cast<size_t>(Metrics::ConnectionDrop::kCount));
// Canonical codes 0..16.
constexpr int kNumCodes = 17;

std::string S(absl::string_view v) { return std::string(v); }
std::string S(std::string_view v) { return std::string(v); }

int PoolIndex(Tier t) { return t == Tier::kT2 ? 1 : 0; }

}  // namespace

absl::string_view RpcName(Metrics::Rpc rpc) {
  static constexpr std::array<absl::string_view, 10> kNames = {
      "RegisterWorker", "Heartbeat", "OpenSequence", "SubmitSnapshot", "AckPlan",
      "CloseSequence",  "GetStatus", "CloseWorker",  "ChannelHello",   "FetchExtents"};
  static_assert(kNames.size() == static_cast<size_t>(Metrics::Rpc::kCount));
  int i = static_cast<int>(rpc);
  return i >= 0 && i < static_cast<int>(kNames.size()) ? kNames[i] : "unknown";
}

struct Metrics::Families {
  static constexpr int kRpcs = static_cast<int>(Rpc::kCount);
  std::array<prometheus::Gauge*, 2> pool_capacity{}, pool_used{}, pool_reserved{}, pool_slots{},
      pool_spare{};
  std::array<std::array<prometheus::Counter*, 2>, 2> alloc_failures{};  // [pool][reason]
  std::array<prometheus::Gauge*, tiering::kNumTiers> placement_tokens{};
  prometheus::Gauge* hbm_saved = nullptr;
  prometheus::Gauge* workers = nullptr;
  prometheus::Gauge* sequences = nullptr;
  prometheus::Counter* lease_expirations = nullptr;
  std::array<prometheus::Counter*, kRpcs> requests{};
  prometheus::Family<prometheus::Counter>* errors_family = nullptr;
  prometheus::Counter* snapshots = nullptr;
  prometheus::Histogram* plan_latency = nullptr;
  std::array<prometheus::Histogram*, 3> lost_mass{};  // compressed, evicted, total
  std::array<prometheus::Counter*, kNumMoveKinds> moves{}, moved_bytes{};
  prometheus::Counter* evicted_tokens = nullptr;
  std::array<prometheus::Counter*, 3> degraded{};
  prometheus::Counter* protected_overflow = nullptr;
  std::array<prometheus::Counter*, 3> acks{};  // [refused, applied, abandoned]
  std::array<prometheus::Counter*, kDropNames.size()> dropped{};
  std::array<prometheus::Gauge*, 2> lane_connections{};
  std::array<prometheus::Gauge*, 2> lane_realtime{};
  prometheus::Gauge* channel_connections = nullptr;
  prometheus::Gauge* channel_accept_paused = nullptr;
  prometheus::Gauge* sink_backlog = nullptr;
  prometheus::Gauge* sink_stalled = nullptr;
  std::array<prometheus::Gauge*, 2> pool_draining{};
  prometheus::Gauge* draining_holders = nullptr;
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()), f_(std::make_unique<Families>()) {}
Metrics::~Metrics() = default;

std::unique_ptr<Metrics> Metrics::Create() {
  std::unique_ptr<Metrics> m(new Metrics());
  prometheus::Registry& r = *m->registry_;
  Families& f = *m->f_;
  auto gauge = [&r](const char* name, const char* help) -> prometheus::Family<prometheus::Gauge>& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(r);
  };
  auto counter = [&r](const char* name,
                      const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  auto& cap = gauge("kvtier_pool_capacity_bytes", "Bytes of slot space in the pool.");
  auto& used = gauge("kvtier_pool_used_bytes", "Bytes of granted slots in the pool.");
  auto& reserved = gauge("kvtier_pool_reserved_bytes",
                         "Bytes of the extents workers hold (used plus slack inside extents).");
  auto& spare = gauge("kvtier_pool_spare_bytes",
                      "Bytes of extents made ahead and not yet handed to a worker.");
  auto& slots = gauge("kvtier_pool_used_slots", "Granted slots in the pool.");
  auto& draining = gauge("kvtier_pool_draining_bytes",
                         "Bytes of extents of ended sessions still held by a live process "
                         "(charged to the budget until it exits).");
  f.draining_holders =
      &gauge("kvtier_pool_draining_holders", "Processes still holding extents of ended sessions.")
           .Add({});
  auto& failures = counter("kvtier_pool_allocation_failures_total",
                           "Slot requests refused because the pool or the worker quota was short.");
  for (Tier t : {Tier::kT1, Tier::kT2}) {
    prometheus::Labels l{{"tier", S(tiering::TierName(t))}};
    int i = PoolIndex(t);
    f.pool_capacity[i] = &cap.Add(l);
    f.pool_used[i] = &used.Add(l);
    f.pool_reserved[i] = &reserved.Add(l);
    f.pool_spare[i] = &spare.Add(l);
    f.pool_slots[i] = &slots.Add(l);
    f.pool_draining[i] = &draining.Add(l);
    for (int reason = 0; reason < 2; ++reason) {
      f.alloc_failures[i][reason] = &failures.Add(
          {{"tier", S(tiering::TierName(t))}, {"reason", S(kAllocFailureNames[reason])}});
    }
  }
  auto& tokens = gauge("kvtier_placement_tokens",
                       "Token positions per tier over open sequences' committed placements.");
  for (int t = 0; t < tiering::kNumTiers; ++t) {
    f.placement_tokens[t] = &tokens.Add({{"tier", S(tiering::TierName(static_cast<Tier>(t)))}});
  }
  f.hbm_saved = &gauge("kvtier_hbm_saved_bytes",
                       "Sum over open sequences of full_bytes - t0_bytes (HBM not needed).")
                     .Add({});
  f.workers = &gauge("kvtier_registry_workers", "Registered workers with a live lease.").Add({});
  f.sequences = &gauge("kvtier_registry_sequences", "Open sequences.").Add({});
  f.lease_expirations =
      &counter("kvtier_lease_expirations_total", "Workers reaped after their lease expired.")
           .Add({});
  auto& requests = counter("kvtier_rpc_requests_total", "Requests handled by the daemon core.");
  for (int i = 0; i < Families::kRpcs; ++i) {
    f.requests[i] = &requests.Add({{"rpc", S(RpcName(static_cast<Rpc>(i)))}});
  }
  f.errors_family = &counter("kvtier_rpc_errors_total",
                             "Requests answered with an error, by canonical status code.");
  // The codes the core answers with exist from the start at 0, so rate() sees the first error
  // of each (a series born at its first increment has no earlier sample to differ from).
  for (int i = 0; i < Families::kRpcs; ++i) {
    for (absl::StatusCode code :
         {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
          absl::StatusCode::kFailedPrecondition, absl::StatusCode::kResourceExhausted,
          absl::StatusCode::kPermissionDenied}) {
      f.errors_family->Add({{"rpc", S(RpcName(static_cast<Rpc>(i)))},
                            {"code", absl::AsciiStrToLower(absl::StatusCodeToString(code))}});
    }
  }
  f.snapshots =
      &counter("kvtier_snapshots_total", "Snapshots accepted (a plan was produced).").Add({});
  f.plan_latency = &prometheus::BuildHistogram()
                        .Name("kvtier_plan_latency_seconds")
                        .Help("SubmitSnapshot handling time: validation, policy, plan, slots.")
                        .Register(r)
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                     1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0});
  auto& lost_mass = prometheus::BuildHistogram()
                        .Name("kvtier_sequence_lost_mass_ratio")
                        .Help(
                            "Attention mass per decode step a sequence could not serve "
                            "exactly (per snapshot): T2 mass x codec error, the evicted "
                            "pages' estimate, and their total.")
                        .Register(r);
  const char* parts[] = {"compressed", "evicted", "total"};
  for (int i = 0; i < 3; ++i) {
    f.lost_mass[i] = &lost_mass.Add(
        {{"part", parts[i]}}, prometheus::Histogram::BucketBoundaries{
                                  1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0});
  }
  auto& moves = counter("kvtier_plan_moves_total", "Planned page moves by kind.");
  auto& bytes = counter("kvtier_plan_moved_bytes_total",
                        "Bytes planned per direction (destination copy size).");
  for (int k = 0; k < kNumMoveKinds; ++k) {
    f.moves[k] = &moves.Add({{"kind", S(kMoveKindNames[k])}});
    f.moved_bytes[k] = &bytes.Add({{"kind", S(kMoveKindNames[k])}});
  }
  f.evicted_tokens =
      &counter("kvtier_plan_evicted_tokens_total", "Tokens newly evicted by committed plans.")
           .Add({});
  auto& degraded =
      counter("kvtier_plan_degraded_total", "Plans degraded because a pool or quota was short.");
  for (int i = 0; i < 3; ++i) f.degraded[i] = &degraded.Add({{"reason", S(kDegradeNames[i])}});
  f.protected_overflow = &counter("kvtier_plan_protected_overflow_total",
                                  "Plans whose protected pages alone exceed the T0 budget.")
                              .Add({});
  auto& acks = counter("kvtier_plan_acks_total", "Plan acknowledgements by result.");
  f.acks[0] = &acks.Add({{"result", "refused"}});
  f.acks[1] = &acks.Add({{"result", "applied"}});
  f.acks[2] = &acks.Add({{"result", "abandoned"}});
  auto& dropped = counter("kvtier_connections_dropped_total",
                          "Connections kvtierd closed because of what their peer did.");
  for (size_t i = 0; i < kDropNames.size(); ++i) {
    f.dropped[i] = &dropped.Add({{"reason", S(kDropNames[i])}});
  }
  for (int lane = 0; lane < 2; ++lane) {
    const std::string name = lane == 0 ? "heartbeat" : "snapshot";
    f.lane_connections[lane] =
        &gauge(absl::StrCat("kvtier_", name, "_lane_connections").c_str(),
               absl::StrCat("Connections the ", name, " lane keeps.").c_str())
             .Add({});
    f.lane_realtime[lane] =
        &gauge(absl::StrCat("kvtier_", name, "_lane_realtime").c_str(),
               absl::StrCat("1 while the ", name, " lane's thread runs at SCHED_FIFO.").c_str())
             .Add({});
  }
  f.channel_connections =
      &gauge("kvtier_channel_connections", "Memory channel connections waiting for an answer.")
           .Add({});
  f.channel_accept_paused = &gauge("kvtier_channel_accept_paused",
                                   "1 while the memory channel backs off accept() (descriptors "
                                   "or memory short).")
                                 .Add({});
  f.sink_backlog = &gauge("kvtier_channel_sink_backlog",
                          "Descriptors from peers waiting to be closed off the serving threads.")
                        .Add({});
  f.sink_stalled = &gauge("kvtier_channel_sink_stalled_seconds",
                          "How long the descriptor sink's close under way has blocked (0 = idle).")
                        .Add({});
  m->blocks_ = std::make_unique<BlockMetrics>(r);
  return m;
}

void Metrics::SetPool(Tier tier, uint64_t capacity, uint64_t used, uint64_t reserved,
                      uint64_t slots, uint64_t spare) {
  int i = PoolIndex(tier);
  f_->pool_spare[i]->Set(static_cast<double>(spare));
  f_->pool_capacity[i]->Set(static_cast<double>(capacity));
  f_->pool_used[i]->Set(static_cast<double>(used));
  f_->pool_reserved[i]->Set(static_cast<double>(reserved));
  f_->pool_slots[i]->Set(static_cast<double>(slots));
}

void Metrics::SetDraining(const std::array<uint64_t, 2>& bytes, uint64_t holders) {
  for (int i = 0; i < 2; ++i) f_->pool_draining[i]->Set(static_cast<double>(bytes[i]));
  f_->draining_holders->Set(static_cast<double>(holders));
}

void Metrics::CountAllocationFailure(Tier tier, AllocFailure reason) {
  f_->alloc_failures[PoolIndex(tier)][static_cast<int>(reason)]->Increment();
}

void Metrics::SetPlacementTokens(const std::array<uint64_t, tiering::kNumTiers>& tokens) {
  for (int t = 0; t < tiering::kNumTiers; ++t) {
    f_->placement_tokens[t]->Set(static_cast<double>(tokens[t]));
  }
}

void Metrics::SetHbmSavedBytes(uint64_t bytes) { f_->hbm_saved->Set(static_cast<double>(bytes)); }

void Metrics::SetRegistry(uint64_t workers, uint64_t sequences) {
  f_->workers->Set(static_cast<double>(workers));
  f_->sequences->Set(static_cast<double>(sequences));
}

void Metrics::CountLeaseExpirations(uint64_t n) {
  f_->lease_expirations->Increment(static_cast<double>(n));
}

void Metrics::CountRequest(Rpc rpc) { f_->requests[static_cast<int>(rpc)]->Increment(); }

void Metrics::CountError(Rpc rpc, absl::StatusCode code) {
  int c = static_cast<int>(code);
  if (c <= 0 || c >= kNumCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  // Series appear on first use; Family::Add is thread-safe and returns the existing series.
  std::string name =
      absl::AsciiStrToLower(absl::StatusCodeToString(static_cast<absl::StatusCode>(c)));
  f_->errors_family->Add({{"rpc", S(RpcName(rpc))}, {"code", name}}).Increment();
}

void Metrics::CountSnapshot(double latency_seconds) {
  f_->snapshots->Increment();
  f_->plan_latency->Observe(latency_seconds);
}

void Metrics::ObserveLostMass(double compressed, double evicted) {
  f_->lost_mass[0]->Observe(compressed);
  f_->lost_mass[1]->Observe(evicted);
  f_->lost_mass[2]->Observe(compressed + evicted);
}

void Metrics::CountMove(MoveKind kind, uint64_t bytes) {
  int k = static_cast<int>(kind);
  f_->moves[k]->Increment();
  f_->moved_bytes[k]->Increment(static_cast<double>(bytes));
}

void Metrics::CountEvictedTokens(uint64_t tokens) {
  f_->evicted_tokens->Increment(static_cast<double>(tokens));
}

void Metrics::CountDegraded(DegradeReason reason) {
  f_->degraded[static_cast<int>(reason)]->Increment();
}

void Metrics::CountProtectedOverflow() { f_->protected_overflow->Increment(); }

void Metrics::CountAck(bool applied) { f_->acks[applied ? 1 : 0]->Increment(); }
void Metrics::CountAbandonedPlan() { f_->acks[2]->Increment(); }

void Metrics::CountDroppedConnection(ConnectionDrop reason) {
  f_->dropped[static_cast<int>(reason)]->Increment();
}

void Metrics::SetLaneConnections(Lane lane, uint64_t kept) {
  f_->lane_connections[static_cast<int>(lane)]->Set(static_cast<double>(kept));
}

void Metrics::SetLaneRealtime(Lane lane, bool realtime) {
  f_->lane_realtime[static_cast<int>(lane)]->Set(realtime ? 1 : 0);
}

void Metrics::SetChannelConnections(uint64_t waiting) {
  f_->channel_connections->Set(static_cast<double>(waiting));
}

void Metrics::SetChannelAcceptPaused(bool paused) {
  f_->channel_accept_paused->Set(paused ? 1 : 0);
}

void Metrics::SetDescriptorSink(uint64_t backlog, double stalled_seconds) {
  f_->sink_backlog->Set(static_cast<double>(backlog));
  f_->sink_stalled->Set(stalled_seconds);
}

}  // namespace kvtier::daemon
