#include "daemon/daemon_core.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "0.0.0"
#endif

namespace kvtier::daemon {
namespace internal {
namespace {

using tiering::Tier;

constexpr size_t kMaxNameBytes = 256;
constexpr uint32_t kMaxLayers = 4096, kMaxKvHeads = 4096, kMaxHeadDim = 16384;
constexpr uint32_t kMaxPageTokens = 1u << 16;
constexpr uint64_t kMaxPromptTokens = 1ull << 32;

uint64_t Ms(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Milliseconds(d)); }

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::Status CheckMax(absl::string_view field, uint64_t value, uint64_t max) {
  if (value <= max) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be <= ", max, ", got ", value));
}

absl::StatusOr<layout::KvGeometry> ValidateGeometry(const v1::RegisterWorkerRequest& r) {
  if (!r.has_geometry()) return Invalid("geometry", "is required");
  const v1::ModelGeometry& g = r.geometry();
  RETURN_IF_ERROR(CheckMax("geometry.model_name length", g.model_name().size(), kMaxNameBytes));
  RETURN_IF_ERROR(CheckMax("geometry.num_layers", g.num_layers(), kMaxLayers));
  RETURN_IF_ERROR(CheckMax("geometry.num_kv_heads", g.num_kv_heads(), kMaxKvHeads));
  RETURN_IF_ERROR(CheckMax("geometry.head_dim", g.head_dim(), kMaxHeadDim));
  RETURN_IF_ERROR(CheckMax("geometry.page_tokens", g.page_tokens(), kMaxPageTokens));
  layout::KvGeometry geo;
  geo.num_layers = g.num_layers();
  geo.num_kv_heads = g.num_kv_heads();
  geo.head_dim = g.head_dim();
  geo.element_bytes = g.element_bytes();
  geo.page_tokens = g.page_tokens();
  geo.layer_groups = g.layer_groups();
  if (absl::Status s = geo.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("geometry.", s.message()));
  }
  return geo;
}

std::string SafeText(const std::string& s) { return s.substr(0, kMaxNameBytes); }

void FillPool(const Pool& pool, v1::PoolDescriptor* d) {
  d->set_kind(pool.kind == layout::PoolKind::kDdr ? v1::POOL_KIND_DDR : v1::POOL_KIND_COMPRESSED);
  d->set_shm_name(pool.segment.name());
  d->set_size_bytes(pool.segment.size());
  d->set_data_offset(pool.segment.header().data_offset);
  d->set_abi_version(pool.segment.header().abi_version);
}

}  // namespace

DaemonCoreImpl::DaemonCoreImpl(const CoreOptions& options, Clock* clock, Metrics* metrics,
                               uint64_t epoch, std::unique_ptr<Pool> ddr,
                               std::unique_ptr<Pool> compressed)
    : clock_(clock),
      metrics_(metrics),
      epoch_(epoch),
      start_(clock->Now()),
      // Ids of different daemon lifetimes do not collide: they start at an epoch-derived base.
      id_base_(((epoch & 0x7FFFFFFFull) << 24) | 1),
      pools_{std::move(ddr), std::move(compressed)},
      options_(options),
      next_worker_id_(id_base_),
      next_sequence_id_(id_base_) {
  absl::MutexLock lock(&mu_);
  UpdateGaugesLocked();
}

DaemonCoreImpl::~DaemonCoreImpl() {
  absl::MutexLock lock(&mu_);
  sequences_.clear();  // releases every slot before the pools go away
  workers_.clear();
}

bool DaemonCoreImpl::ExpiredLocked(const WorkerRec& w) const {
  return clock_->Now() - w.last_seen > options_.lease_ttl;
}

absl::StatusOr<WorkerRec*> DaemonCoreImpl::AuthenticateLocked(uint64_t id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    if (id >= id_base_ && id < next_worker_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker_id ", id, ": lease expired; register again"));
    }
    return absl::NotFoundError(
        absl::StrCat("worker_id ", id, " is unknown (daemon restarted?); register again"));
  }
  if (ExpiredLocked(it->second)) {
    FreeWorkerLocked(id);
    if (metrics_ != nullptr) metrics_->CountLeaseExpirations(1);
    UpdateGaugesLocked();
    return absl::FailedPreconditionError(
        absl::StrCat("worker_id ", id, ": lease expired; register again"));
  }
  it->second.last_seen = clock_->Now();
  return &it->second;
}

absl::StatusOr<SequenceRec*> DaemonCoreImpl::FindSequenceLocked(const WorkerRec& w,
                                                                uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", sequence_id, " not found"));
  }
  if (it->second.worker_id != w.id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "sequence_id ", sequence_id, " belongs to another worker, not worker_id ", w.id));
  }
  return &it->second;
}

int DaemonCoreImpl::PoolOf(const Slot& slot) const {
  return slot.allocator() == &pools_[1]->slots ? 1 : 0;
}

std::optional<Slot> DaemonCoreImpl::GrantLocked(WorkerRec& w, Tier tier, bool count_failures,
                                                Metrics::DegradeReason* reason) {
  const int i = PoolIndex(tier);
  const uint64_t quota =
      i == 0 ? options_.worker_ddr_quota_bytes : options_.worker_compressed_quota_bytes;
  const uint64_t rounded = (w.page_bytes[i] + layout::kSlotAlignment - 1) / layout::kSlotAlignment *
                           layout::kSlotAlignment;
  if (quota > 0 && w.pool_bytes[i] + rounded > quota) {
    *reason = Metrics::DegradeReason::kQuota;
    if (metrics_ != nullptr && count_failures) {
      metrics_->CountAllocationFailure(tier, Metrics::AllocFailure::kQuota);
    }
    return std::nullopt;
  }
  absl::StatusOr<Slot> slot = pools_[i]->slots.Allocate(w.page_bytes[i]);
  if (!slot.ok()) {
    *reason = i == 0 ? Metrics::DegradeReason::kDdrFull : Metrics::DegradeReason::kCompressedFull;
    if (metrics_ != nullptr && count_failures) {
      metrics_->CountAllocationFailure(tier, Metrics::AllocFailure::kPoolFull);
    }
    return std::nullopt;
  }
  w.pool_bytes[i] += slot->bytes();
  return std::move(*slot);
}

void DaemonCoreImpl::ReleaseLocked(WorkerRec& w, Slot& slot) {
  if (!slot.valid()) return;
  w.pool_bytes[PoolOf(slot)] -= slot.bytes();
  slot.Reset();
}

uint64_t DaemonCoreImpl::FreeSequenceLocked(WorkerRec& w, uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return 0;
  SequenceRec& s = it->second;
  uint64_t freed = 0;
  for (Slot& slot : s.slots) {
    freed += slot.valid() ? 1 : 0;
    ReleaseLocked(w, slot);
  }
  if (s.pending.has_value()) {
    for (PendingMove& m : s.pending->moves) {
      freed += m.dst.valid() ? 1 : 0;
      ReleaseLocked(w, m.dst);
    }
  }
  SetFiguresLocked(s, PlacementFigures{});
  w.sequences.erase(sequence_id);
  sequences_.erase(it);
  return freed;
}

void DaemonCoreImpl::FreeWorkerLocked(uint64_t worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  WorkerRec& w = it->second;
  std::vector<uint64_t> seqs(w.sequences.begin(), w.sequences.end());
  for (uint64_t id : seqs) FreeSequenceLocked(w, id);
  workers_.erase(it);
}

void DaemonCoreImpl::SetFiguresLocked(SequenceRec& s, const PlacementFigures& f) {
  for (int t = 0; t < tiering::kNumTiers; ++t) {
    total_tokens_[t] += f.tokens[t] - s.figures.tokens[t];
  }
  total_full_bytes_ += f.full_bytes - s.figures.full_bytes;
  total_t0_bytes_ += f.t0_bytes - s.figures.t0_bytes;
  s.figures = f;
}

void DaemonCoreImpl::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  for (Tier t : {Tier::kT1, Tier::kT2}) {
    const SlotAllocator& a = pools_[PoolIndex(t)]->slots;
    metrics_->SetPool(t, a.capacity(), a.used_bytes(), a.reserved_bytes(), a.slots_used());
  }
  metrics_->SetPlacementTokens(total_tokens_);
  metrics_->SetHbmSavedBytes(total_full_bytes_ - total_t0_bytes_);
  metrics_->SetRegistry(workers_.size(), sequences_.size());
}

absl::StatusOr<v1::RegisterWorkerResponse> DaemonCoreImpl::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  absl::MutexLock lock(&mu_);
  return Count(Metrics::Rpc::kRegisterWorker, RegisterLocked(request));
}

absl::StatusOr<v1::RegisterWorkerResponse> DaemonCoreImpl::RegisterLocked(
    const v1::RegisterWorkerRequest& r) {
  RETURN_IF_ERROR(CheckMax("worker_name length", r.worker_name().size(), kMaxNameBytes));
  if (r.pid() < 0) return Invalid("pid", absl::StrCat("must be >= 0, got ", r.pid()));
  ASSIGN_OR_RETURN(layout::KvGeometry geo, ValidateGeometry(r));
  uint64_t page_bytes = 0;
  for (uint32_t g = 0; g < geo.layer_groups; ++g)
    page_bytes = std::max(page_bytes, geo.PageBytes(g));
  if (r.t1_page_bytes() < page_bytes) {
    return Invalid("t1_page_bytes", absl::StrCat(r.t1_page_bytes(),
                                                 " is smaller than one page of "
                                                 "the largest layer group (",
                                                 page_bytes, ")"));
  }
  const uint64_t ddr_cap = pools_[0]->slots.capacity(), cmp_cap = pools_[1]->slots.capacity();
  if (r.t1_page_bytes() > ddr_cap) {
    return Invalid("t1_page_bytes",
                   absl::StrCat(r.t1_page_bytes(), " exceeds the DDR pool (", ddr_cap, " bytes)"));
  }
  if (r.t2_page_bytes() == 0 || r.t2_page_bytes() > cmp_cap) {
    return Invalid("t2_page_bytes",
                   absl::StrCat("must be in [1, ", cmp_cap, "], got ", r.t2_page_bytes()));
  }
  if (workers_.size() >= options_.max_workers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_workers (", options_.max_workers, ") reached"));
  }
  WorkerRec w;
  w.id = next_worker_id_++;
  w.name = SafeText(r.worker_name());
  w.pid = r.pid();
  w.model_name = SafeText(r.geometry().model_name());
  w.geometry = geo;
  w.hbm_budget_bytes = r.hbm_budget_bytes();
  w.page_bytes = {r.t1_page_bytes(), r.t2_page_bytes()};
  w.last_seen = clock_->Now();
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(w.id);
  resp.set_lease_ttl_ms(Ms(options_.lease_ttl));
  resp.set_heartbeat_interval_ms(Ms(options_.heartbeat_interval));
  resp.set_daemon_epoch(epoch_);
  for (const auto& pool : pools_) FillPool(*pool, resp.add_pools());
  workers_.emplace(w.id, std::move(w));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> DaemonCoreImpl::Heartbeat(
    const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  return Count(Metrics::Rpc::kHeartbeat, HeartbeatLocked(request));
}

absl::StatusOr<v1::HeartbeatResponse> DaemonCoreImpl::HeartbeatLocked(
    const v1::HeartbeatRequest& r) {
  if (r.daemon_epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat("daemon_epoch ", r.daemon_epoch(),
                                                      " is not the daemon's (", epoch_,
                                                      "): the daemon restarted; register again"));
  }
  absl::StatusOr<WorkerRec*> w = AuthenticateLocked(r.worker_id());
  if (!w.ok()) {
    // A heartbeat from any worker the daemon does not know means: register again.
    return absl::FailedPreconditionError(w.status().message());
  }
  v1::HeartbeatResponse resp;
  resp.set_lease_ttl_ms(Ms(options_.lease_ttl));
  return resp;
}

absl::StatusOr<v1::OpenSequenceResponse> DaemonCoreImpl::OpenSequence(
    const v1::OpenSequenceRequest& request) {
  absl::MutexLock lock(&mu_);
  return Count(Metrics::Rpc::kOpenSequence, OpenLocked(request));
}

absl::StatusOr<v1::OpenSequenceResponse> DaemonCoreImpl::OpenLocked(
    const v1::OpenSequenceRequest& r) {
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id()));
  RETURN_IF_ERROR(CheckMax("prompt_tokens", r.prompt_tokens(), kMaxPromptTokens));
  RETURN_IF_ERROR(CheckMax("tag length", r.tag().size(), kMaxNameBytes));
  ASSIGN_OR_RETURN(PolicySpec policy, ValidatePolicy(r.policy(), w->geometry.page_tokens));
  if (w->sequences.size() >= options_.max_sequences_per_worker) {
    return absl::ResourceExhaustedError(absl::StrCat("worker_id ", w->id, " has ",
                                                     w->sequences.size(),
                                                     " open sequences: max_sequences_per_worker"));
  }
  SequenceRec s;
  s.id = next_sequence_id_++;
  s.worker_id = w->id;
  s.tag = r.tag();
  s.policy = std::move(policy);
  s.prompt_tokens = r.prompt_tokens();
  s.placement.num_groups = w->geometry.layer_groups;
  s.placement.num_pages = 0;
  w->sequences.insert(s.id);
  v1::OpenSequenceResponse resp;
  resp.set_sequence_id(s.id);
  sequences_.emplace(s.id, std::move(s));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::CloseSequenceResponse> DaemonCoreImpl::CloseSequence(
    const v1::CloseSequenceRequest& request) {
  absl::MutexLock lock(&mu_);
  return Count(Metrics::Rpc::kCloseSequence, CloseLocked(request));
}

absl::StatusOr<v1::CloseSequenceResponse> DaemonCoreImpl::CloseLocked(
    const v1::CloseSequenceRequest& r) {
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id()));
  ASSIGN_OR_RETURN(SequenceRec * s, FindSequenceLocked(*w, r.sequence_id()));
  v1::CloseSequenceResponse resp;
  resp.set_slots_freed(FreeSequenceLocked(*w, s->id));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::GetStatusResponse> DaemonCoreImpl::GetStatus(
    const v1::GetStatusRequest& request) {
  absl::MutexLock lock(&mu_);
  return Count(Metrics::Rpc::kGetStatus,
               absl::StatusOr<v1::GetStatusResponse>(StatusLocked(request)));
}

v1::GetStatusResponse DaemonCoreImpl::StatusLocked(const v1::GetStatusRequest& r) {
  const absl::Duration now = clock_->Now();
  v1::GetStatusResponse resp;
  resp.set_version(KVTIER_VERSION);
  resp.set_daemon_epoch(epoch_);
  resp.set_uptime_ms(Ms(now - start_));
  resp.set_listen_address(options_.listen_address);
  resp.set_metrics_address(options_.metrics_address);
  resp.set_workers(static_cast<uint32_t>(workers_.size()));
  resp.set_sequences(static_cast<uint32_t>(sequences_.size()));
  for (const auto& pool : pools_) {
    v1::PoolStatus* p = resp.add_pools();
    p->set_kind(pool->kind == layout::PoolKind::kDdr ? v1::POOL_KIND_DDR
                                                     : v1::POOL_KIND_COMPRESSED);
    p->set_shm_name(pool->segment.name());
    p->set_capacity_bytes(pool->slots.capacity());
    p->set_used_bytes(pool->slots.used_bytes());
    p->set_slots_used(pool->slots.slots_used());
  }
  resp.set_hbm_saved_bytes(total_full_bytes_ - total_t0_bytes_);
  if (r.include_workers()) {
    for (const auto& [id, w] : workers_) {
      v1::WorkerStatus* ws = resp.add_worker_list();
      ws->set_worker_id(id);
      ws->set_worker_name(w.name);
      ws->set_pid(w.pid);
      ws->set_model_name(w.model_name);
      ws->set_sequences(static_cast<uint32_t>(w.sequences.size()));
      ws->set_ddr_bytes(w.pool_bytes[0]);
      ws->set_compressed_bytes(w.pool_bytes[1]);
      absl::Duration left = w.last_seen + options_.lease_ttl - now;
      ws->set_lease_remaining_ms(left > absl::ZeroDuration() ? Ms(left) : 0);
    }
  }
  if (r.include_sequences()) {
    for (const auto& [id, s] : sequences_) {
      v1::SequenceStatus* ss = resp.add_sequence_list();
      ss->set_sequence_id(id);
      ss->set_worker_id(s.worker_id);
      ss->set_tag(s.tag);
      ss->set_policy(s.policy.name);
      ss->set_length(s.length);
      ss->set_plan_version(s.last_applied);
      s.figures.ToProto(ss->mutable_report());
    }
  }
  return resp;
}

int DaemonCoreImpl::ReapExpired() {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> expired;
  for (const auto& [id, w] : workers_) {
    if (ExpiredLocked(w)) expired.push_back(id);
  }
  for (uint64_t id : expired) FreeWorkerLocked(id);
  if (metrics_ != nullptr && !expired.empty()) metrics_->CountLeaseExpirations(expired.size());
  UpdateGaugesLocked();
  return static_cast<int>(expired.size());
}

void DaemonCoreImpl::Reload(const CoreOptions& options) {
  absl::MutexLock lock(&mu_);
  options_.worker_ddr_quota_bytes = options.worker_ddr_quota_bytes;
  options_.worker_compressed_quota_bytes = options.worker_compressed_quota_bytes;
  options_.max_workers = options.max_workers;
  options_.max_sequences_per_worker = options.max_sequences_per_worker;
  if (options.lease_ttl > absl::ZeroDuration()) options_.lease_ttl = options.lease_ttl;
  if (options.heartbeat_interval > absl::ZeroDuration()) {
    options_.heartbeat_interval = options.heartbeat_interval;
  }
}

}  // namespace internal

namespace {

absl::Status ValidateOptions(const CoreOptions& o) {
  if (o.ddr_pool_bytes < layout::kSlotAlignment) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddr_pool_bytes must be >= ", layout::kSlotAlignment, ", got ", o.ddr_pool_bytes));
  }
  if (o.compressed_pool_bytes < layout::kSlotAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed_pool_bytes must be >= ", layout::kSlotAlignment, ", got ",
                     o.compressed_pool_bytes));
  }
  if (o.lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must be positive");
  }
  if (o.shm_prefix.size() < 2 || o.shm_prefix[0] != '/' ||
      o.shm_prefix.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_prefix \"", o.shm_prefix, "\" must look like \"/name\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<internal::Pool>> MakePool(const CoreOptions& o,
                                                         layout::PoolKind kind, uint64_t epoch) {
  ShmSegmentOptions so;
  so.kind = kind;
  so.name = absl::StrCat(o.shm_prefix, kind == layout::PoolKind::kDdr ? "-ddr-" : "-cmp-", epoch);
  so.total_bytes = layout::kPoolDataOffset +
                   (kind == layout::PoolKind::kDdr ? o.ddr_pool_bytes : o.compressed_pool_bytes);
  so.mode = o.shm_mode;
  so.group = o.shm_group;
  so.daemon_epoch = epoch;
  ASSIGN_OR_RETURN(ShmSegment seg, ShmSegment::Create(so));
  return std::make_unique<internal::Pool>(std::move(seg), kind);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonCore>> DaemonCore::Create(const CoreOptions& options,
                                                               Clock* clock, Metrics* metrics) {
  RETURN_IF_ERROR(ValidateOptions(options));
  uint64_t epoch = options.daemon_epoch;
  while (epoch == 0) {
    std::random_device rd;
    epoch = (uint64_t{rd()} << 32 | rd()) & 0x7FFFFFFFFFFFFFFFull;
  }
  ASSIGN_OR_RETURN(auto ddr, MakePool(options, layout::PoolKind::kDdr, epoch));
  ASSIGN_OR_RETURN(auto cmp, MakePool(options, layout::PoolKind::kCompressed, epoch));
  return std::unique_ptr<DaemonCore>(
      new internal::DaemonCoreImpl(options, clock, metrics, epoch, std::move(ddr), std::move(cmp)));
}

}  // namespace kvtier::daemon
