#include "daemon/daemon_core.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"
#include "edge/message_limits.h"
#include "edge/session.h"

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
constexpr uint64_t kMaxLength = 1ull << 32;  // positions of one sequence (open, heartbeats)
// A slot may exceed one page of the declared geometry by this factor at most (alignment and
// padding of the worker's own layout); a compressed slot may exceed a full one by as much.
constexpr uint64_t kMaxSlotSlack = 2;
constexpr absl::Duration kTicketTtl = absl::Seconds(30);
constexpr size_t kMaxTickets = 4096;
// Outstanding tickets one process may hold, so that no process spends another's share: root
// worker pods (or any uid several tenants share) are told apart by their process (pidfd). A
// peer the daemon holds no pidfd of counts against its uid's share of the same size.
constexpr size_t kMaxTicketsPerProcess = 64;
// Outstanding tickets of all the processes of one uid: a quarter of the node's, so that one
// user's many processes cannot spend every other user's share.
constexpr size_t kMaxTicketsPerUid = kMaxTickets / 4;
constexpr uint32_t kExtentsPerReply = edge::kMaxFdsPerMessage - 1;  // the header rides first

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

// A heartbeat's sequence sizes into `lengths` (replacing them), or INVALID_ARGUMENT naming the
// field, the value and the limit (and nothing taken).
absl::Status TakeSizes(const v1::HeartbeatRequest& r, uint32_t max_sizes,
                       absl::flat_hash_map<uint64_t, uint64_t>& lengths) {
  if (r.sequences_size() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckMax("sequences (entries; limits.max_sequences_per_worker)",
                           static_cast<uint64_t>(r.sequences_size()), max_sizes));
  for (int i = 0; i < r.sequences_size(); ++i) {
    RETURN_IF_ERROR(
        CheckMax(absl::StrCat("sequences[", i, "].length"), r.sequences(i).length(), kMaxLength));
  }
  lengths.clear();
  for (const v1::SequenceSize& size : r.sequences()) lengths[size.sequence_id()] = size.length();
  return absl::OkStatus();
}

}  // namespace

uint64_t EffectiveExtentBytes(uint64_t configured, uint64_t capacity) {
  uint64_t e = std::min(configured, std::max(layout::kExtentAlignment, capacity / 16));
  e = std::min(e, capacity);
  return e / 4096 * 4096;
}

namespace {

void FillPool(const WorkerMemory& memory, layout::PoolKind kind, int numa_node,
              v1::PoolDescriptor* d) {
  d->set_kind(WireKind(kind));
  const bool vmm = memory.memory() == ExtentMemory::kCudaVmm;
  d->set_memory(vmm ? v1::POOL_MEMORY_CUDA_VMM : v1::POOL_MEMORY_MEMFD);
  d->set_numa_node(vmm ? numa_node : 0);
  d->set_size_bytes(memory.max_extents() * memory.extent_bytes());
  d->set_data_offset(0);
  d->set_abi_version(layout::kPoolAbiVersion);
  d->set_extent_bytes(memory.extent_bytes());
  d->set_max_extents(static_cast<uint32_t>(memory.max_extents()));
}

bool Contains(const std::vector<uint32_t>& v, uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool InGroup(const edge::PeerCredentials& peer, gid_t gid) {
  return peer.gid == gid ||
         std::find(peer.groups.begin(), peer.groups.end(), gid) != peer.groups.end();
}

}  // namespace

absl::Status CheckSameUid(const WorkerRec& w, const edge::PeerCredentials* peer) {
  if (peer == nullptr || peer->uid == w.peer.uid) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("worker_id ", w.id, " registered as uid ", w.peer.uid, ", not uid ", peer->uid));
}

DaemonCoreImpl::DaemonCoreImpl(const CoreOptions& options, Clock* clock, Metrics* metrics,
                               uint64_t epoch, CoreHooks hooks)
    : clock_(clock),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      epoch_(epoch),
      start_(clock->Now()),
      // Ids of different daemon lifetimes do not collide: they start at an epoch-derived base.
      id_base_(((epoch & 0x7FFFFFFFull) << 24) | 1),
      daemon_uid_(getuid()),
      daemon_gid_(getgid()),
      blocks_(options.blocks, options.shm_prefix.substr(1), epoch, metrics,
              [this](const edge::PeerCredentials& peer) {
                PiMutexLock lock(&mu_);
                return AllowedLocked(options_.security, peer);
              }),
      options_(options),
      next_worker_id_(id_base_),
      next_sequence_id_(id_base_) {
  const std::string label = options.shm_prefix.substr(1);
  for (layout::PoolKind kind : {layout::PoolKind::kDdr, layout::PoolKind::kCompressed}) {
    const bool ddr = kind == layout::PoolKind::kDdr;
    const uint64_t capacity = ddr ? options.ddr_pool_bytes : options.compressed_pool_bytes;
    ExtentSource source{options.pool_memory[ddr ? 0 : 1], options.extent_dir, options.cuda.get(),
                        options.pinned_numa_node};
    pools_[ddr ? 0 : 1] = std::make_unique<PoolBudget>(
        kind, capacity, EffectiveExtentBytes(options.extent_bytes, capacity),
        absl::StrCat(label, ddr ? "-ddr" : "-cmp"), std::move(source));
  }
  PiMutexLock lock(&mu_);
  UpdateGaugesLocked();
  PiMutexLock lease_lock(&lease_mu_);
  lease_ttl_ = options.lease_ttl;
  heartbeat_interval_ = options.heartbeat_interval;
  issued_below_ = id_base_;
  max_sizes_ = options.max_sequences_per_worker;
}

DaemonCoreImpl::~DaemonCoreImpl() {
  PiMutexLock lock(&mu_);
  sequences_.clear();  // releases every slot before the pools go away
  workers_.clear();
}

bool DaemonCoreImpl::LeaseExpiredLocked(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() || clock_->Now() - it->second.last_seen > lease_ttl_;
}

double DaemonCoreImpl::StepSecondsLocked(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? 0 : it->second.step_seconds;
}

absl::StatusOr<WorkerRec*> DaemonCoreImpl::AuthenticateLocked(uint64_t id,
                                                              const std::string& secret, Via via) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    PiMutexLock lease_lock(&lease_mu_);
    if (auto r = revoked_.find(id); r != revoked_.end()) {
      return absl::PermissionDeniedError(r->second);
    }
  }
  if (it != workers_.end() && !edge::SecretsEqual(secret, it->second.secret)) {
    return absl::PermissionDeniedError(absl::StrCat("session_secret does not match worker_id ", id,
                                                    secret.empty() ? " (none given)" : ""));
  }
  if (it == workers_.end()) {
    if (id >= id_base_ && id < next_worker_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker_id ", id, ": lease expired; register again"));
    }
    return absl::NotFoundError(
        absl::StrCat("worker_id ", id, " is unknown (daemon restarted?); register again"));
  }
  bool expired;
  {
    PiMutexLock lease_lock(&lease_mu_);
    expired = LeaseExpiredLocked(id);
    if (!expired) {
      Lease& lease = leases_.at(id);
      lease.last_seen = clock_->Now();
      if (via == Via::kRpc) lease.last_call = lease.last_seen;
    }
  }
  if (expired) {
    FreeWorkerLocked(id);
    if (metrics_ != nullptr) metrics_->CountLeaseExpirations(1);
    UpdateGaugesLocked();
    return absl::FailedPreconditionError(
        absl::StrCat("worker_id ", id, ": lease expired; register again"));
  }
  return &it->second;
}

absl::StatusOr<std::shared_ptr<SequenceRec>> DaemonCoreImpl::FindSequenceLocked(
    const WorkerRec& w, uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", sequence_id, " not found"));
  }
  if (it->second->worker_id != w.id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "sequence_id ", sequence_id, " belongs to another worker, not worker_id ", w.id));
  }
  return it->second;
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
  absl::StatusOr<Slot> slot = w.memory[i]->Allocate(w.page_bytes[i]);
  if (!slot.ok()) {
    *reason = i == 0 ? Metrics::DegradeReason::kDdrFull : Metrics::DegradeReason::kCompressedFull;
    if (metrics_ != nullptr && count_failures) {
      metrics_->CountAllocationFailure(tier, Metrics::AllocFailure::kPoolFull);
    }
    return std::nullopt;
  }
  w.pool_bytes[i] += slot->bytes();
  used_bytes_[i] += slot->bytes();
  ++slots_used_[i];
  return std::move(*slot);
}

void DaemonCoreImpl::ReleaseLocked(WorkerRec& w, Slot& slot) {
  if (!slot.valid()) return;
  const int i = PoolOf(slot);
  w.pool_bytes[i] -= slot.bytes();
  used_bytes_[i] -= slot.bytes();
  --slots_used_[i];
  slot.Reset();
}

uint64_t DaemonCoreImpl::FreeSequenceLocked(WorkerRec& w, uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return 0;
  SequenceRec& s = *it->second;
  uint64_t freed = 0;
  for (auto& [i, slot] : s.slots) {
    freed += slot.valid() ? 1 : 0;
    ReleaseLocked(w, slot);
  }
  s.slots.clear();
  w.entries -= s.entries();
  total_entries_ -= s.entries();
  s.closed = true;
  if (s.pending.has_value()) {
    for (PendingMove& m : s.pending->moves) {
      freed += m.dst.valid() ? 1 : 0;
      ReleaseLocked(w, m.dst);
    }
  }
  SetFiguresLocked(s, PlacementFigures{});
  w.scheduled_bytes -= s.scheduled_bytes;
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
  RetireMemoryLocked(w);
  workers_.erase(it);
  PiMutexLock lease_lock(&lease_mu_);
  leases_.erase(worker_id);
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
    const int i = PoolIndex(t);
    const uint64_t spare = pools_[i]->unassigned() * pools_[i]->extent_bytes();
    metrics_->SetPool(t, pools_[i]->capacity(), used_bytes_[i], pools_[i]->reserved_bytes() - spare,
                      slots_used_[i], spare);
  }
  uint64_t holders = 0;
  for (const DrainingMemory& d : draining_) holders += d.holders.size();
  metrics_->SetDraining(draining_bytes_, holders);
  metrics_->SetPlacementTokens(total_tokens_);
  metrics_->SetHbmSavedBytes(total_full_bytes_ - total_t0_bytes_);
  metrics_->SetRegistry(workers_.size(), sequences_.size());
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::Hello(const edge::PeerCredentials& peer) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kChannelHello, HelloLocked(peer));
}

absl::Status DaemonCoreImpl::AllowedLocked(const SecurityOptions& sec,
                                           const edge::PeerCredentials& peer) const {
  const gid_t pool_gid = sec.pool_gid == static_cast<gid_t>(-1) ? daemon_gid_ : sec.pool_gid;
  const bool by_default = sec.allow_uids.empty() && sec.allow_gids.empty();
  bool allowed;
  std::string rule;
  if (by_default) {
    allowed = peer.uid == 0 || peer.uid == daemon_uid_ || InGroup(peer, pool_gid);
    rule = absl::StrCat("not root, not the daemon's uid ", daemon_uid_,
                        " and not in the pool group (gid ", pool_gid,
                        "; security.allow_uids and security.allow_gids are empty)");
  } else {
    allowed = Contains(sec.allow_uids, peer.uid) ||
              std::any_of(sec.allow_gids.begin(), sec.allow_gids.end(),
                          [&](uint32_t g) { return InGroup(peer, g); });
    rule = absl::StrCat("not in security.allow_uids [", absl::StrJoin(sec.allow_uids, ", "),
                        "] and in no group of security.allow_gids [",
                        absl::StrJoin(sec.allow_gids, ", "), "]");
  }
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("uid ", peer.uid, " (gid ", peer.gid, ", pid ",
                                                  peer.pid, ") may not register: ", rule));
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::HelloLocked(const edge::PeerCredentials& peer) {
  const SecurityOptions& sec = options_.security;
  RETURN_IF_ERROR(AllowedLocked(sec, peer));
  const absl::Duration now = clock_->Now();
  absl::erase_if(tickets_, [&](const auto& kv) { return kv.second.expires <= now; });
  if (tickets_.size() >= kMaxTickets) {
    return absl::ResourceExhaustedError(
        absl::StrCat(tickets_.size(), " channel tickets outstanding; try again shortly"));
  }
  // The process when the kernel names it (a pidfd; unit tests' peers by their pid), else the uid.
  uint64_t process_id = 0;
  if (peer.process != nullptr) {
    process_id = peer.process->id();
  } else if (absl::StatusOr<std::shared_ptr<const edge::PeerProcess>> p =
                 edge::PeerProcess::OfPid(peer.pid);
             p.ok()) {
    process_id = (*p)->id();
  }
  size_t of_uid = 0, of_process = 0;
  for (const auto& [t, ticket] : tickets_) {
    if (ticket.peer.uid != peer.uid) continue;
    ++of_uid;
    of_process += process_id == 0 ? 1 : ticket.process_id == process_id;
  }
  const size_t share = process_id == 0 ? kMaxTicketsPerProcess : kMaxTicketsPerUid;
  if (of_process >= kMaxTicketsPerProcess || of_uid >= share) {
    const bool mine = of_process >= kMaxTicketsPerProcess;
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", peer.uid, mine && process_id != 0 ? absl::StrCat(" pid ", peer.pid) : "", " holds ",
        mine ? of_process : of_uid, " unspent channel tickets (at most ",
        mine ? kMaxTicketsPerProcess : share, mine && process_id != 0 ? " per process" : " per uid",
        "); they expire in ", Ms(kTicketTtl) / 1000, " s"));
  }
  ASSIGN_OR_RETURN(std::string ticket, edge::NewSecret());
  const bool operator_view = peer.uid == daemon_uid_ || Contains(sec.operator_uids, peer.uid);
  edge::PeerCredentials named = peer;
  named.process.reset();  // a ticket holds no descriptor
  tickets_[ticket] = Ticket{std::move(named), process_id, now + kTicketTtl, operator_view};
  v1::ChannelReply reply;
  reply.set_ticket(std::move(ticket));
  reply.set_operator_(operator_view);
  reply.set_ticket_ttl_ms(Ms(kTicketTtl));
  reply.set_peer_uid(peer.uid);
  reply.set_peer_gid(peer.gid);
  reply.set_peer_pid(peer.pid);
  return reply;
}

absl::StatusOr<Ticket> DaemonCoreImpl::RedeemTicketLocked(const std::string& t, bool consume,
                                                          absl::string_view field) {
  auto it = tickets_.find(t);
  if (t.empty() || it == tickets_.end() || it->second.expires <= clock_->Now()) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, t.empty() ? " is missing" : " is not a live ticket",
                     ": ask the memory channel (the socket's path + \".mem\") for one first"));
  }
  Ticket ticket = it->second;
  if (consume) tickets_.erase(it);
  return ticket;
}

absl::StatusOr<v1::RegisterWorkerResponse> DaemonCoreImpl::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kRegisterWorker, RegisterLocked(request));
}

absl::StatusOr<std::array<ExtentMemory, 2>> DaemonCoreImpl::MemoryFor(v1::PoolMemory want) const {
  std::array<ExtentMemory, 2> memory;
  for (int i = 0; i < 2; ++i) {
    memory[i] = pools_[i]->memory();
    if (want == v1::POOL_MEMORY_MEMFD) memory[i] = ExtentMemory::kMemfd;
    if (want == v1::POOL_MEMORY_CUDA_VMM && memory[i] != ExtentMemory::kCudaVmm) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool_memory CUDA_VMM: the ", i == 0 ? "DDR" : "compressed",
                       " pool is memfd here (pools.backend = \"", options_.pool_backend,
                       "\"; kvtierd's start-up log says why)"));
    }
  }
  if (want != v1::POOL_MEMORY_UNSPECIFIED && want != v1::POOL_MEMORY_MEMFD &&
      want != v1::POOL_MEMORY_CUDA_VMM) {
    return Invalid("pool_memory", absl::StrCat(static_cast<int>(want), " is not a PoolMemory"));
  }
  return memory;
}

absl::Status DaemonCoreImpl::CreateMemoryLocked(WorkerRec& w,
                                                const std::array<ExtentMemory, 2>& memory) {
  for (int i = 0; i < 2; ++i) {
    PoolBudget& budget = *pools_[i];
    // The whole budget, whatever the quota: quotas are checked per grant in bytes and may be
    // raised by a reload.
    const uint64_t max_extents = std::max<uint64_t>(1, budget.capacity() / budget.extent_bytes());
    layout::PoolHeader header =
        layout::MakePoolHeader(budget.kind(), budget.extent_bytes(), max_extents, w.id, epoch_,
                               static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
    ASSIGN_OR_RETURN(Extent sealed,
                     Extent::CreateSealedHeader(absl::StrCat(budget.label(), "-header"), header));
    w.memory[i] =
        std::make_unique<WorkerMemory>(&budget, i, max_extents, std::move(sealed), memory[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> DaemonCoreImpl::RegisterLocked(
    const v1::RegisterWorkerRequest& r) {
  RETURN_IF_ERROR(CheckMax("worker_name length", r.worker_name().size(), kMaxNameBytes));
  if (r.pid() < 0) return Invalid("pid", absl::StrCat("must be >= 0, got ", r.pid()));
  ASSIGN_OR_RETURN(layout::KvGeometry geo, ValidateGeometry(r));
  ASSIGN_OR_RETURN(LinkDecl link, ValidateLink(r));
  uint64_t page_bytes = 0;
  for (uint32_t g = 0; g < geo.layer_groups; ++g)
    page_bytes = std::max(page_bytes, geo.PageBytes(g));
  if (r.t1_page_bytes() < page_bytes || r.t1_page_bytes() > kMaxSlotSlack * page_bytes) {
    return Invalid("t1_page_bytes",
                   absl::StrCat(r.t1_page_bytes(), " must be in [", page_bytes, ", ",
                                kMaxSlotSlack * page_bytes,
                                "]: one page of the largest layer group, at most twice that"));
  }
  const uint64_t t2_max = kMaxSlotSlack * r.t1_page_bytes();
  if (r.t2_page_bytes() == 0 || r.t2_page_bytes() > t2_max) {
    return Invalid("t2_page_bytes",
                   absl::StrCat("must be in [1, ", t2_max, "] (twice t1_page_bytes), got ",
                                r.t2_page_bytes()));
  }
  for (int i = 0; i < 2; ++i) {
    const uint64_t slot = i == 0 ? r.t1_page_bytes() : r.t2_page_bytes();
    if (slot > pools_[i]->extent_bytes()) {
      return Invalid(i == 0 ? "t1_page_bytes" : "t2_page_bytes",
                     absl::StrCat(slot, " exceeds one ", i == 0 ? "DDR" : "compressed", " extent (",
                                  pools_[i]->extent_bytes(), " bytes; pools.extent_mib)"));
    }
  }
  ASSIGN_OR_RETURN(const auto memory, MemoryFor(r.pool_memory()));
  if (workers_.size() >= options_.max_workers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_workers (", options_.max_workers, ") reached"));
  }
  // Last check before anything changes: the ticket is spent only by a registration that works.
  ASSIGN_OR_RETURN(Ticket ticket,
                   RedeemTicketLocked(r.channel_ticket(), /*consume=*/false, "channel_ticket"));
  RETURN_IF_ERROR(ScopeLinkLocked(ticket.peer.uid, link));
  WorkerRec w;
  w.id = next_worker_id_;
  ASSIGN_OR_RETURN(w.secret, edge::NewSecret());
  RETURN_IF_ERROR(CreateMemoryLocked(w, memory));
  tickets_.erase(r.channel_ticket());
  ++next_worker_id_;
  w.peer = ticket.peer;
  w.name = SafeText(r.worker_name());
  w.pid = ticket.peer.pid;  // the kernel's word, not the request's
  w.model_name = SafeText(r.geometry().model_name());
  w.geometry = geo;
  w.hbm_budget_bytes = r.hbm_budget_bytes();
  w.page_bytes = {r.t1_page_bytes(), r.t2_page_bytes()};
  w.link = std::move(link);
  {
    PiMutexLock lease_lock(&lease_mu_);
    const absl::Duration now = clock_->Now();
    leases_[w.id] = Lease{w.secret, w.peer.uid, now, now, 0, {}};
    w.registered = now;
    issued_below_ = w.id + 1;
  }
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(w.id);
  resp.set_session_secret(w.secret);
  resp.set_lease_ttl_ms(Ms(options_.lease_ttl));
  resp.set_heartbeat_interval_ms(Ms(options_.heartbeat_interval));
  resp.set_daemon_epoch(epoch_);
  resp.set_max_snapshot_entries(options_.max_snapshot_entries);
  resp.set_max_message_bytes(edge::MaxSnapshotBytes(options_.max_snapshot_entries));
  for (int i = 0; i < 2; ++i) {
    FillPool(*w.memory[i], pools_[i]->kind(), options_.pinned_numa_node, resp.add_pools());
  }
  workers_.emplace(w.id, std::move(w));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> DaemonCoreImpl::Heartbeat(
    const v1::HeartbeatRequest& request) {
  return Count(Metrics::Rpc::kHeartbeat, RenewLease(request, nullptr));
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::ChannelHeartbeat(
    const edge::PeerCredentials& peer, const v1::HeartbeatRequest& request) {
  // Worker 0 is never issued: a health probe's heartbeat (edge/health_probe.h), refused through
  // the lock a worker's takes and counted as no worker's error.
  if (request.worker_id() == 0) {
    PiMutexLock lease_lock(&lease_mu_);
    return absl::FailedPreconditionError("worker_id 0 is never issued (a health probe?)");
  }
  absl::StatusOr<v1::HeartbeatResponse> beat =
      Count(Metrics::Rpc::kHeartbeat, RenewLease(request, &peer));
  if (!beat.ok()) return beat.status();
  v1::ChannelReply reply;
  *reply.mutable_heartbeat() = *std::move(beat);
  return reply;
}

absl::StatusOr<v1::HeartbeatResponse> DaemonCoreImpl::RenewLease(
    const v1::HeartbeatRequest& r, const edge::PeerCredentials* channel_peer) {
  if (r.daemon_epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat("daemon_epoch ", r.daemon_epoch(),
                                                      " is not the daemon's (", epoch_,
                                                      "): the daemon restarted; register again"));
  }
  const uint64_t id = r.worker_id();
  PiMutexLock lease_lock(&lease_mu_);
  auto it = leases_.find(id);
  if (it != leases_.end() && !edge::SecretsEqual(r.session_secret(), it->second.secret)) {
    return absl::PermissionDeniedError(
        absl::StrCat("session_secret does not match worker_id ", id,
                     r.session_secret().empty() ? " (none given)" : ""));
  }
  if (it == leases_.end()) {
    if (auto r = revoked_.find(id); r != revoked_.end()) {
      return absl::PermissionDeniedError(r->second);
    }
  }
  // A heartbeat from any worker the daemon does not know means: register again.
  if (it == leases_.end() || LeaseExpiredLocked(id)) {
    // Nothing renews an expired lease; the next holder of mu_ frees the record (ReapExpired).
    if (it != leases_.end()) leases_.erase(it);
    const bool issued = id >= id_base_ && id < issued_below_;
    return absl::FailedPreconditionError(
        issued ? absl::StrCat("worker_id ", id, ": lease expired; register again")
               : absl::StrCat("worker_id ", id, " is unknown (daemon restarted?); register again"));
  }
  Lease& lease = it->second;
  if (channel_peer != nullptr && channel_peer->uid != lease.uid) {
    return absl::PermissionDeniedError(absl::StrCat("worker_id ", id, " registered as uid ",
                                                    lease.uid, ", not uid ", channel_peer->uid));
  }
  // The lease is renewed either way: a bad figure is refused, the worker is not punished.
  lease.last_seen = clock_->Now();
  if (channel_peer == nullptr) lease.last_call = lease.last_seen;
  RETURN_IF_ERROR(ValidateStepSeconds(r.step_seconds()));
  lease.step_seconds = r.step_seconds();
  RETURN_IF_ERROR(TakeSizes(r, max_sizes_, lease.lengths));
  v1::HeartbeatResponse resp;
  resp.set_lease_ttl_ms(Ms(lease_ttl_));
  resp.set_heartbeat_interval_ms(Ms(heartbeat_interval_));
  return resp;
}

absl::StatusOr<v1::OpenSequenceResponse> DaemonCoreImpl::OpenSequence(
    const v1::OpenSequenceRequest& request) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kOpenSequence, OpenLocked(request));
}

absl::StatusOr<v1::OpenSequenceResponse> DaemonCoreImpl::OpenLocked(
    const v1::OpenSequenceRequest& r) {
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id(), r.session_secret()));
  RETURN_IF_ERROR(CheckMax("prompt_tokens", r.prompt_tokens(), kMaxPromptTokens));
  RETURN_IF_ERROR(CheckMax("length", r.length(), kMaxLength));
  if (r.protected_prompt_begin() > r.prompt_tokens()) {
    return Invalid("protected_prompt_begin",
                   absl::StrCat("must be <= prompt_tokens (", r.prompt_tokens(), "), got ",
                                r.protected_prompt_begin()));
  }
  RETURN_IF_ERROR(CheckMax("tag length", r.tag().size(), kMaxNameBytes));
  ASSIGN_OR_RETURN(PolicySpec policy, ValidatePolicy(r.policy(), w->geometry.page_tokens));
  if (w->sequences.size() >= options_.max_sequences_per_worker) {
    return absl::ResourceExhaustedError(absl::StrCat("worker_id ", w->id, " has ",
                                                     w->sequences.size(),
                                                     " open sequences: max_sequences_per_worker"));
  }
  if (sequences_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the node has ", sequences_.size(), " open sequences: limits.max_sequences"));
  }
  auto rec = std::make_shared<SequenceRec>();
  SequenceRec& s = *rec;
  s.id = next_sequence_id_++;
  s.worker_id = w->id;
  s.tag = r.tag();
  s.policy = std::move(policy);
  s.prompt_tokens = r.prompt_tokens();
  s.protected_prompt_begin = r.protected_prompt_begin();
  s.open_length = r.length();
  s.placement.num_groups = w->geometry.layer_groups;
  s.placement.num_pages = 0;
  w->sequences.insert(s.id);
  v1::OpenSequenceResponse resp;
  resp.set_sequence_id(s.id);
  sequences_.emplace(s.id, std::move(rec));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::CloseSequenceResponse> DaemonCoreImpl::CloseSequence(
    const v1::CloseSequenceRequest& request) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kCloseSequence, CloseLocked(request));
}

absl::StatusOr<v1::CloseSequenceResponse> DaemonCoreImpl::CloseLocked(
    const v1::CloseSequenceRequest& r) {
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id(), r.session_secret()));
  ASSIGN_OR_RETURN(std::shared_ptr<SequenceRec> s, FindSequenceLocked(*w, r.sequence_id()));
  v1::CloseSequenceResponse resp;
  resp.set_slots_freed(FreeSequenceLocked(*w, s->id));
  UpdateGaugesLocked();
  return resp;
}

absl::StatusOr<v1::CloseWorkerResponse> DaemonCoreImpl::CloseWorker(
    const v1::CloseWorkerRequest& request) {
  PiMutexLock lock(&mu_);
  absl::StatusOr<v1::CloseWorkerResponse> result =
      [&]() -> absl::StatusOr<v1::CloseWorkerResponse> {
    ASSIGN_OR_RETURN(WorkerRec * w,
                     AuthenticateLocked(request.worker_id(), request.session_secret()));
    v1::CloseWorkerResponse resp;
    resp.set_sequences_closed(static_cast<uint32_t>(w->sequences.size()));
    FreeWorkerLocked(w->id);
    UpdateGaugesLocked();
    return resp;
  }();
  return Count(Metrics::Rpc::kCloseWorker, std::move(result));
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::FetchExtents(const edge::PeerCredentials& peer,
                                                              const v1::FetchExtents& request,
                                                              std::vector<edge::UniqueFd>* fds) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kFetchExtents, FetchLocked(peer, request, fds));
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::FetchLocked(const edge::PeerCredentials& peer,
                                                             const v1::FetchExtents& r,
                                                             std::vector<edge::UniqueFd>* fds) {
  ASSIGN_OR_RETURN(WorkerRec * w,
                   AuthenticateLocked(r.worker_id(), r.session_secret(), Via::kChannel));
  RETURN_IF_ERROR(CheckSameUid(*w, &peer));
  if (r.kind() != v1::POOL_KIND_DDR && r.kind() != v1::POOL_KIND_COMPRESSED) {
    return Invalid("kind", absl::StrCat(static_cast<int>(r.kind()),
                                        " is not DDR (1) or "
                                        "COMPRESSED (2)"));
  }
  const WorkerMemory& memory = *w->memory[r.kind() == v1::POOL_KIND_DDR ? 0 : 1];
  RETURN_IF_ERROR(AddHolderLocked(*w, peer, memory.memory() != ExtentMemory::kMemfd));
  if (r.first_extent() > memory.num_extents()) {
    return Invalid("first_extent", absl::StrCat(r.first_extent(), " is past the worker's ",
                                                memory.num_extents(), " extents"));
  }
  const uint32_t count = std::min(kExtentsPerReply, memory.num_extents() - r.first_extent());
  std::vector<edge::UniqueFd> dups;
  auto dup_fd = [&](int fd) -> absl::Status {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return absl::ResourceExhaustedError("out of file descriptors");
    dups.emplace_back(d);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(dup_fd(memory.header_fd()));
  for (uint32_t i = 0; i < count; ++i) {
    // An open of its own (Extent::Share): the daemon sees when every process has let go of it.
    ASSIGN_OR_RETURN(edge::UniqueFd shared, memory.extent(r.first_extent() + i).Share());
    dups.push_back(std::move(shared));
  }
  *fds = std::move(dups);
  v1::ChannelReply reply;
  reply.set_first_extent(r.first_extent());
  reply.set_extent_count(count);
  reply.set_total_extents(memory.num_extents());
  reply.set_peer_uid(peer.uid);
  reply.set_peer_gid(peer.gid);
  reply.set_peer_pid(peer.pid);
  return reply;
}

int DaemonCoreImpl::ReapExpired() {
  blocks_.ReapExited();
  PiMutexLock lock(&mu_);
  std::vector<uint64_t> expired;
  {
    // Decided and removed in one go under lease_mu_: no heartbeat renews a lease found expired.
    PiMutexLock lease_lock(&lease_mu_);
    for (const auto& [id, w] : workers_) {
      if (LeaseExpiredLocked(id)) expired.push_back(id);
    }
    for (uint64_t id : expired) leases_.erase(id);
  }
  for (uint64_t id : expired) FreeWorkerLocked(id);
  if (metrics_ != nullptr && !expired.empty()) metrics_->CountLeaseExpirations(expired.size());
  ReleaseDrainedLocked();
  const absl::Duration now = clock_->Now();
  absl::erase_if(tickets_, [&](const auto& kv) { return kv.second.expires <= now; });
  UpdateGaugesLocked();
  return static_cast<int>(expired.size());
}

std::optional<absl::Duration> DaemonCoreImpl::SinceLastCall(pid_t pid) {
  PiMutexLock lock(&mu_);
  std::optional<absl::Duration> since;
  const absl::Duration now = clock_->Now();
  PiMutexLock lease_lock(&lease_mu_);
  for (const auto& [id, w] : workers_) {
    if (w.peer.pid != pid || LeaseExpiredLocked(id)) continue;
    since = std::min(since.value_or(absl::InfiniteDuration()), now - leases_.at(id).last_call);
  }
  return since;
}

void DaemonCoreImpl::PrepareSpareExtents() {
  constexpr size_t kSpares = 2;
  for (const auto& pool : pools_) {
    PoolBudget& budget = *pool;
    for (;;) {
      {
        PiMutexLock lock(&mu_);
        if (!budget.WantsSpare(kSpares)) break;
        budget.BeginSpare();
      }
      if (!MakeSpare(budget)) break;  // the slow part, with no lock held
    }
  }
}

absl::Status DaemonCoreImpl::Reload(const CoreOptions& options, std::vector<std::string>* revoked) {
  PiMutexLock lock(&mu_);
  const absl::Duration ttl =
      options.lease_ttl > absl::ZeroDuration() ? options.lease_ttl : options_.lease_ttl;
  const absl::Duration beat = options.heartbeat_interval > absl::ZeroDuration()
                                  ? options.heartbeat_interval
                                  : options_.heartbeat_interval;
  if (ttl <= beat) {
    return absl::InvalidArgumentError(
        absl::StrCat("leases.ttl_ms ", Ms(ttl), " must exceed leases.heartbeat_ms ", Ms(beat),
                     ": workers would lose their leases between heartbeats"));
  }
  options_.worker_ddr_quota_bytes = options.worker_ddr_quota_bytes;
  options_.worker_compressed_quota_bytes = options.worker_compressed_quota_bytes;
  options_.max_workers = options.max_workers;
  options_.max_sequences_per_worker = options.max_sequences_per_worker;
  options_.max_sequences = options.max_sequences;
  options_.security = options.security;
  options_.lease_ttl = ttl;
  options_.heartbeat_interval = beat;
  options_.max_worker_entries = options.max_worker_entries;
  options_.max_node_entries = options.max_node_entries;
  RevokeDisallowedLocked(revoked);  // takes lease_mu_ itself (FreeWorkerLocked)
  PiMutexLock lease_lock(&lease_mu_);
  lease_ttl_ = ttl;
  heartbeat_interval_ = beat;
  max_sizes_ = options.max_sequences_per_worker;
  return absl::OkStatus();
}

}  // namespace internal

namespace {

absl::Status ValidateOptions(const CoreOptions& o) {
  constexpr uint64_t kMinPool = 4096;
  if (o.ddr_pool_bytes < kMinPool) {
    return absl::InvalidArgumentError(
        absl::StrCat("ddr_pool_bytes must be >= ", kMinPool, ", got ", o.ddr_pool_bytes));
  }
  if (o.compressed_pool_bytes < kMinPool) {
    return absl::InvalidArgumentError(absl::StrCat("compressed_pool_bytes must be >= ", kMinPool,
                                                   ", got ", o.compressed_pool_bytes));
  }
  if (o.extent_bytes < kMinPool) {
    return absl::InvalidArgumentError(
        absl::StrCat("extent_bytes must be >= ", kMinPool, ", got ", o.extent_bytes));
  }
  for (ExtentMemory m : o.pool_memory) {
    if (m == ExtentMemory::kCudaVmm && o.cuda == nullptr) {
      return absl::InvalidArgumentError("a CUDA VMM pool needs the driver (CoreOptions.cuda)");
    }
  }
  if (o.lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must be positive");
  }
  if (o.lease_ttl <= o.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ttl ", absl::FormatDuration(o.lease_ttl),
                                                   " must exceed heartbeat_interval ",
                                                   absl::FormatDuration(o.heartbeat_interval)));
  }
  if (o.max_snapshot_entries == 0 || o.max_snapshot_entries > edge::kMaxSnapshotEntriesCap) {
    return absl::InvalidArgumentError(absl::StrCat("max_snapshot_entries must be in [1, ",
                                                   edge::kMaxSnapshotEntriesCap, "], got ",
                                                   o.max_snapshot_entries));
  }
  if (o.max_worker_entries == 0 || o.max_node_entries == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_worker_entries and max_node_entries must be >= 1, got ",
                     o.max_worker_entries, " and ", o.max_node_entries));
  }
  for (size_t i = 0; i < o.links.size(); ++i) {
    const LinkEntry& l = o.links[i];
    if (l.id.empty() || !(l.bytes_per_second > 0 && l.bytes_per_second <= kMaxLinkBytesPerSecond)) {
      return absl::InvalidArgumentError(
          absl::StrCat("links[", i, "] \"", l.id, "\": needs an id and ",
                       "bytes_per_second in (0, ", kMaxLinkBytesPerSecond, "]"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (o.links[j].id == l.id) {
        return absl::InvalidArgumentError(absl::StrCat("links: link_id \"", l.id, "\" twice"));
      }
    }
  }
  if (o.shm_prefix.size() < 2 || o.shm_prefix[0] != '/' ||
      o.shm_prefix.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_prefix \"", o.shm_prefix, "\" must look like \"/name\""));
  }
  return absl::OkStatus();
}

// Extents must be creatable before any worker relies on them: one of each pool is made and
// dropped. An extent directory is refused: files there cannot be sealed (tmpfs seals only
// memfds), so a worker could grow its own extent and fill the filesystem for every worker.
absl::Status ProbeExtents(const CoreOptions& o) {
  if (!o.extent_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pools.extent_dir = \"", o.extent_dir,
        "\" is refused: files in a directory cannot be sealed against growing (only memfds "
        "can), so any worker could grow its extent and fill that filesystem for every other "
        "worker; leave it empty (sealed memfd extents) and bound the daemon's memory with its "
        "cgroup (MemoryMax=, docs/security.md)"));
  }
  for (int i = 0; i < 2; ++i) {
    const uint64_t capacity = i == 0 ? o.ddr_pool_bytes : o.compressed_pool_bytes;
    const uint64_t bytes = internal::EffectiveExtentBytes(o.extent_bytes, capacity);
    const ExtentSource source{o.pool_memory[i], o.extent_dir, o.cuda.get(), o.pinned_numa_node};
    absl::StatusOr<Extent> probe = Extent::Make("kvtier-probe", bytes, source);
    if (!probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat("cannot create pool extents: ", probe.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonCore>> DaemonCore::Create(const CoreOptions& options,
                                                               Clock* clock, Metrics* metrics) {
  RETURN_IF_ERROR(ValidateOptions(options));
  RETURN_IF_ERROR(ProbeExtents(options));
  uint64_t epoch = options.daemon_epoch;
  while (epoch == 0) {
    std::random_device rd;
    epoch = (uint64_t{rd()} << 32 | rd()) & 0x7FFFFFFFFFFFFFFFull;
  }
  return std::unique_ptr<DaemonCore>(new internal::DaemonCoreImpl(options, clock, metrics, epoch));
}

}  // namespace kvtier::daemon
