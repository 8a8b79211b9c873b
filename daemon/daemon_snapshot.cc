// DaemonCoreImpl: snapshots, plans and their acknowledgement (two-phase).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"
#include "edge/message_limits.h"

namespace kvtier::daemon::internal {
namespace {

using tiering::Placement;
using tiering::Tier;

absl::Status Precondition(absl::string_view what) { return absl::FailedPreconditionError(what); }

// A sequence freed (closed, or its worker's lease reaped) while its snapshot was decided.
absl::Status Closed(uint64_t sequence_id) {
  return absl::NotFoundError(
      absl::StrCat("sequence_id ", sequence_id, " was closed while its snapshot was decided"));
}

// Checks a snapshot against the record's versions and length: O(1), under the core's lock.
absl::Status CheckAgainstRecord(const SequenceRec& s, const v1::SubmitSnapshotRequest& r) {
  if (s.pending.has_value()) {
    return Precondition(absl::StrCat("sequence_id ", s.id, ": plan ", s.pending->version,
                                     " is not acknowledged yet (one plan in flight)"));
  }
  if (r.last_plan_version() != s.last_acked && r.last_plan_version() != s.last_applied) {
    return Precondition(absl::StrCat("last_plan_version ", r.last_plan_version(),
                                     " is stale: the last acknowledged plan is ", s.last_acked));
  }
  if (r.length() < s.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", r.length(), " is below the previous snapshot's ", s.length));
  }
  if (r.length() < s.prompt_tokens || r.length() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "length ", r.length(), " must be >= prompt_tokens (", s.prompt_tokens, ") and > 0"));
  }
  return absl::OkStatus();
}

// Checks a snapshot's shape, scores and tiers against the geometry and `acked`, a copy of the
// acknowledged placement: O(entries), so it runs without the core's lock. Changes nothing.
absl::Status ValidateSnapshot(const Placement& acked, const layout::KvGeometry& geo,
                              uint64_t max_entries, const v1::SubmitSnapshotRequest& r) {
  if (r.length() > max_entries * geo.page_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("length ", r.length(), " exceeds ",
                                                   max_entries * geo.page_tokens,
                                                   " (limits.max_snapshot_entries x page_tokens)"));
  }
  const uint64_t pages = geo.NumPages(r.length());
  if (r.num_pages() != pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_pages ", r.num_pages(), " must equal ceil(length / page_tokens) = ", pages));
  }
  const uint64_t entries = pages * geo.layer_groups;
  if (entries > max_entries) {
    return absl::InvalidArgumentError(absl::StrCat("num_pages ", r.num_pages(), " x ",
                                                   geo.layer_groups, " groups exceeds ",
                                                   max_entries, " (limits.max_snapshot_entries)"));
  }
  if (static_cast<uint64_t>(r.page_scores_size()) != entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_scores has ", r.page_scores_size(),
                     " values, expected layer_groups x num_pages = ", entries));
  }
  if (r.current_tiers().size() != entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("current_tiers has ", r.current_tiers().size(),
                     " bytes, expected layer_groups x num_pages = ", entries));
  }
  if (r.has_lost_mass()) {
    const std::pair<const char*, double> parts[] = {
        {"compressed", r.lost_mass().compressed()},
        {"evicted_estimate", r.lost_mass().evicted_estimate()}};
    for (const auto& [field, v] : parts) {
      if (std::isfinite(v) && v >= 0) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("lost_mass.", field, " must be finite and >= 0, got ", v));
    }
  }
  for (int i = 0; i < r.page_scores_size(); ++i) {
    if (!std::isfinite(r.page_scores(i))) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_scores[", i, "] is not finite (", r.page_scores(i), ")"));
    }
  }
  const std::string& tiers = r.current_tiers();
  const uint32_t old_pages = acked.num_pages;
  for (uint32_t g = 0; g < geo.layer_groups; ++g) {
    for (uint64_t p = 0; p < pages; ++p) {
      const uint64_t i = g * pages + p;
      const uint8_t t = static_cast<uint8_t>(tiers[i]);
      if (t > 3) {
        return absl::InvalidArgumentError(
            absl::StrCat("current_tiers[", i, "] is ", int{t}, ", not a tier (0..3)"));
      }
      const Tier expected = p < old_pages ? acked.at(g, static_cast<uint32_t>(p)) : Tier::kT0;
      // A page the worker evicted on its own while the daemon was out of reach (DESIGN.md §3:
      // the same policy, no new offloads), or before the sequence re-opened under a new session,
      // is adopted: the evicted set only grows.
      const bool evicted_by_worker = static_cast<Tier>(t) == Tier::kT3;
      if (static_cast<Tier>(t) != expected && !evicted_by_worker) {
        return Precondition(absl::StrCat("current_tiers[", i, "] (group ", g, ", page ", p,
                                         ") is T", int{t}, " but the acknowledged placement says ",
                                         std::string(tiering::TierName(expected))));
      }
    }
  }
  return absl::OkStatus();
}

// A 64-bit hash of what decides a plan (length, the acknowledged version, tiers and scores),
// eight bytes at a time: it runs under the core's lock on every snapshot.
uint64_t Fingerprint(const v1::SubmitSnapshotRequest& r) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001B3ull;
      h ^= h >> 29;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  };
  const uint64_t fixed[] = {r.length(), r.num_pages(), r.last_plan_version(), r.decode_step()};
  mix(fixed, sizeof(fixed));
  mix(r.current_tiers().data(), r.current_tiers().size());
  mix(r.page_scores().data(), sizeof(float) * r.page_scores_size());
  return h;
}

uint64_t MoveBytes(const layout::KvGeometry& geometry, const std::array<uint64_t, 2>& page_bytes,
                   const tiering::Move& m) {
  switch (m.to) {
    case Tier::kT0:
      return geometry.PageBytes(m.group);
    case Tier::kT1:
      return page_bytes[0];
    case Tier::kT2:
      return page_bytes[1];
    case Tier::kT3:
      return 0;
  }
  return 0;
}

const char* ReasonText(Metrics::DegradeReason r) {
  switch (r) {
    case Metrics::DegradeReason::kDdrFull:
      return "DDR pool full";
    case Metrics::DegradeReason::kCompressedFull:
      return "compressed pool full";
    default:
      return "worker quota reached";
  }
}

// "DDR pool full: 12 pages; 12 compressed instead, 0 kept in their tier (no extra eviction)".
// A pool the system refused to grow says why (`pool_failure`, PoolBudget::last_failure).
std::string DegradedReason(const Shortage& shortage,
                           const std::array<std::string, 2>& pool_failure) {
  std::string reason;
  for (int k = 0; k < 3; ++k) {
    if (shortage.pages[k] == 0) continue;
    absl::StrAppend(&reason, reason.empty() ? "" : "; ",
                    ReasonText(static_cast<Metrics::DegradeReason>(k)), ": ", shortage.pages[k],
                    " pages");
    if (k < 2 && !pool_failure[k].empty()) {
      absl::StrAppend(&reason, " (the pool cannot grow: ", pool_failure[k], ")");
    }
  }
  absl::StrAppend(&reason, "; ", shortage.compressed_instead, " compressed instead, ",
                  shortage.total() - shortage.compressed_instead,
                  " kept in their tier (no extra eviction)");
  return reason;
}

// The latest guardrail a snapshot carried (validated), and the largest total so far.
void RecordLostMass(const v1::LostMass& m, v1::SequenceLostMass& rec) {
  const double total = m.compressed() + m.evicted_estimate();
  rec.set_compressed(m.compressed());
  rec.set_evicted_estimate(m.evicted_estimate());
  rec.set_total(total);
  rec.set_peak_total(std::max(rec.peak_total(), total));
  rec.set_reports(rec.reports() + 1);
}

}  // namespace

SlotMap DaemonCoreImpl::GrantDestinationsLocked(WorkerRec& w, const SequenceRec& s,
                                                absl::Span<const float> scores, Placement& target,
                                                Shortage* shortage) {
  // Page order first; if anything was short, again by ascending score, so that the pages left
  // in T0 are the best-scoring ones.
  const Placement& current = s.placement;
  std::vector<uint32_t> need;
  for (uint32_t i = 0; i < target.tiers.size(); ++i) {
    if (target.tiers[i] != current.tiers[i] && InPool(target.tiers[i])) need.push_back(i);
  }
  SlotMap dst;
  const Placement wanted = target;
  *shortage = GrantLocked(w, s.policy, current, need, /*count_failures=*/false, target, dst);
  if (shortage->total() > 0) {
    for (auto& [i, slot] : dst) ReleaseLocked(w, slot);
    dst.clear();
    target = wanted;
    std::sort(need.begin(), need.end(), [&](uint32_t a, uint32_t b) {
      return scores[a] != scores[b] ? scores[a] < scores[b] : a < b;
    });
    *shortage = GrantLocked(w, s.policy, current, need, /*count_failures=*/true, target, dst);
  }
  return dst;
}

namespace {

// `acked` grown to `num_pages` (new pages in T0), with the pages `tiers` (the snapshot's, of the
// grown shape) reports evicted (T3) evicted: the worker evicted them while the daemon was out of
// reach. Pure: runs without the core's lock.
Placement Grown(const Placement& acked, uint32_t num_pages, const std::string& tiers) {
  const uint32_t groups = acked.num_groups, old = acked.num_pages;
  Placement grown{groups, num_pages, std::vector<Tier>(size_t{groups} * num_pages, Tier::kT0)};
  for (uint32_t g = 0; g < groups; ++g) {
    std::copy_n(acked.tiers.begin() + size_t{g} * old, old,
                grown.tiers.begin() + size_t{g} * num_pages);
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (static_cast<Tier>(tiers[i]) == Tier::kT3) grown.tiers[i] = Tier::kT3;
  }
  return grown;
}

}  // namespace

Shortage DaemonCoreImpl::GrantLocked(WorkerRec& w, const PolicySpec& policy,
                                     const Placement& current, absl::Span<const uint32_t> need,
                                     bool count_failures, Placement& target, SlotMap& dst) {
  Shortage shortage;
  for (uint32_t i : need) {
    const Tier from = current.tiers[i];
    const Tier want = target.tiers[i];
    Metrics::DegradeReason why{};
    std::optional<Slot> slot = GrantLocked(w, want, count_failures, &why);
    if (!slot.has_value()) {
      ++shortage.pages[static_cast<int>(why)];
      // Fallbacks never evict: T1 short -> compress if the policy may; T2 short -> T1.
      Tier alt = Tier::kT0;
      if (want == Tier::kT1 && from == Tier::kT0 && AllowsCompression(policy)) alt = Tier::kT2;
      if (want == Tier::kT2 && from == Tier::kT0) alt = Tier::kT1;
      Metrics::DegradeReason ignored{};
      if (alt != Tier::kT0) slot = GrantLocked(w, alt, count_failures, &ignored);
      if (slot.has_value() && alt == Tier::kT2) ++shortage.compressed_instead;
      // Without a slot the page stays where it is (T0, or its current pool).
      target.tiers[i] = slot.has_value() ? alt : from;
    }
    if (slot.has_value()) dst[i] = std::move(*slot);  // pooled destinations only
  }
  return shortage;
}

// What SubmitSnapshot's phases hand each other. Owned by the call; the unlocked phases read only
// this and the request, never the record.
struct DaemonCoreImpl::Prepared {
  uint64_t sequence_id = 0;
  uint64_t version = 0;
  uint64_t fingerprint = 0;
  PolicySpec policy;
  layout::KvGeometry geometry;
  std::array<uint64_t, 2> page_bytes{};
  uint64_t prompt_tokens = 0, protected_prompt_begin = 0, length = 0;
  Placement current;  // the acknowledged placement, grown to the snapshot (by the unlocked phase)
  PlacementFigures current_figures;  // of `current`
  Decision decision;                 // decision.target: degraded in place by the grant
  Shortage shortage;
  absl::Span<const float> scores;  // the request's
  uint64_t max_entries = 0;        // limits.max_snapshot_entries
  uint64_t max_plan_bytes = 0;
  std::vector<tiering::Move> moves;
  PlacementFigures figures;                 // of the target
  std::optional<ScheduleFigures> schedule;  // the worker declared a link
};

absl::Status DaemonCoreImpl::AdoptLocked(SequenceRec& s, const Prepared& prep) {
  if (s.closed) return Closed(s.id);
  WorkerRec& w = workers_.at(s.worker_id);  // an open sequence's worker is registered
  RETURN_IF_ERROR(CheckEntryBudgetLocked(w, s, prep.current.tiers.size()));
  // plan_mu was held since the copy and no plan is in flight, so the record is as copied.
  const uint32_t old = s.placement.num_pages, num_pages = prep.current.num_pages;
  SlotMap slots;
  slots.reserve(s.slots.size());
  for (auto& [i, slot] : s.slots) {
    const uint32_t at = old == num_pages ? i : i / old * num_pages + i % old;
    if (prep.current.tiers[at] == Tier::kT3) {  // adopted: the worker evicted it
      ReleaseLocked(w, slot);
    } else {
      slots.emplace(at, std::move(slot));
    }
  }
  s.slots = std::move(slots);
  w.entries += prep.current.tiers.size() - s.entries();
  total_entries_ += prep.current.tiers.size() - s.entries();
  s.placement = prep.current;
  s.length = prep.length;
  SetFiguresLocked(s, prep.current_figures);
  return absl::OkStatus();
}

absl::StatusOr<v1::TierPlan> DaemonCoreImpl::SubmitSnapshot(
    const v1::SubmitSnapshotRequest& request) {
  return TimedSnapshot(request, nullptr);
}

absl::StatusOr<v1::ChannelReply> DaemonCoreImpl::ChannelSnapshot(
    const edge::PeerCredentials& peer, const v1::SubmitSnapshotRequest& request) {
  ASSIGN_OR_RETURN(v1::TierPlan plan, TimedSnapshot(request, &peer));
  v1::ChannelReply reply;
  *reply.mutable_plan() = std::move(plan);
  return reply;
}

absl::StatusOr<v1::TierPlan> DaemonCoreImpl::TimedSnapshot(
    const v1::SubmitSnapshotRequest& request, const edge::PeerCredentials* channel_peer) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<v1::TierPlan> plan = Snapshot(request, channel_peer);
  if (plan.ok() && metrics_ != nullptr) {
    metrics_->CountSnapshot(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (request.has_lost_mass()) {
      metrics_->ObserveLostMass(request.lost_mass().compressed(),
                                request.lost_mass().evicted_estimate());
    }
  }
  return Count(Metrics::Rpc::kSubmitSnapshot, std::move(plan));
}

// Phases, three under mu_: (1) authenticate, settle a carried ack, answer a replay, check the
// versions, copy the record; (no lock) validate the snapshot against the copy, grow it, take its
// figures; (2) take the budget of entries and adopt the grown placement into the record; (no
// lock) the policy decision; (3) grant destinations, order the moves, build the wire plan and
// record it in flight (new extents are made before it, without the lock). The sequence's
// plan_mu is held from (1) to the end, so between (1) and (3) its record changes only by being
// freed (an ack needs a plan in flight, and there is none until (3)), which (2) and (3) notice.
absl::StatusOr<v1::TierPlan> DaemonCoreImpl::Snapshot(const v1::SubmitSnapshotRequest& r,
                                                      const edge::PeerCredentials* channel_peer) {
  const uint64_t fingerprint = Fingerprint(r);
  std::shared_ptr<SequenceRec> seq;
  PlanLock plan_lock;
  Prepared prep;
  std::shared_ptr<const v1::TierPlan> replay;
  {
    PiMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id(), r.session_secret(),
                                                       channel_peer ? Via::kChannel : Via::kRpc));
    RETURN_IF_ERROR(CheckSameUid(*w, channel_peer));
    ASSIGN_OR_RETURN(seq, FindSequenceLocked(*w, r.sequence_id()));
    // Mostly free: taken without blocking under mu_ (which the lock order would not allow).
    if (plan_lock.TryLock(&seq->plan_mu)) {
      RETURN_IF_ERROR(PrepareLocked(r, channel_peer, fingerprint, *seq, prep, replay));
    }
  }
  if (!plan_lock.held()) {
    // Another snapshot of this sequence is being decided (a resubmission): wait for it.
    plan_lock.Lock(&seq->plan_mu);
    PiMutexLock lock(&mu_);
    RETURN_IF_ERROR(PrepareLocked(r, channel_peer, fingerprint, *seq, prep, replay));
  }
  if (replay != nullptr) return *replay;  // the same snapshot again: its reply was lost

  // Validation, growth and figures: O(entries), on the copy, without mu_ (heartbeats never took
  // it; acks, status and other sequences' snapshots need not wait for this either).
  RETURN_IF_ERROR(ValidateSnapshot(prep.current, prep.geometry, prep.max_entries, r));
  prep.current = Grown(prep.current, r.num_pages(), r.current_tiers());
  prep.current_figures =
      ComputeFigures(prep.geometry, prep.current, prep.prompt_tokens, prep.length);
  {
    PiMutexLock lock(&mu_);
    RETURN_IF_ERROR(AdoptLocked(*seq, prep));
    if (r.has_lost_mass()) RecordLostMass(r.lost_mass(), seq->lost_mass);
  }
  prep.scores = absl::Span<const float>(r.page_scores().data(), r.page_scores_size());
  if (hooks_.during_decision) hooks_.during_decision(prep.sequence_id);
  ASSIGN_OR_RETURN(prep.decision,
                   DecidePlacement(prep.policy,
                                   {.prompt_tokens = prep.prompt_tokens,
                                    .length = prep.length,
                                    .protected_prompt_begin = prep.protected_prompt_begin},
                                   prep.current, prep.scores));
  // New extents are made without the lock first (at most twice; a grant that still finds no
  // spare, raced away by another sequence's, makes its own under the lock).
  std::shared_ptr<v1::TierPlan> plan;
  for (int round = 0; plan == nullptr; ++round) {
    std::array<uint32_t, 2> make{};
    {
      PiMutexLock lock(&mu_);
      if (round < 2) make = ExtentsToMakeLocked(*seq, prep);
      if (make[0] + make[1] == 0) {
        ASSIGN_OR_RETURN(plan, PlanLocked(*seq, prep));
        break;
      }
    }
    for (int p = 0; p < 2; ++p) {
      for (uint32_t k = 0; k < make[p]; ++k) MakeSpare(*pools_[p]);
    }
  }
  if (prep.schedule.has_value()) {
    // The page lists (a sort over the target's pooled pages) are built without mu_; plan_mu,
    // still held, keeps a replay of this snapshot from reading the plan before they are in.
    const ScheduleFigures& f = *prep.schedule;
    v1::PrefetchSchedule* schedule = plan->mutable_schedule();
    BuildSchedule(prep.decision.target, prep.scores, prep.page_bytes, f.budget, schedule);
    schedule->set_h2d_bytes_per_second(f.h2d_grant);
    schedule->set_step_seconds(f.step_seconds);
  }
  if (metrics_ != nullptr) CountPlan(prep);
  return *plan;
}

absl::Status DaemonCoreImpl::PrepareLocked(const v1::SubmitSnapshotRequest& r,
                                           const edge::PeerCredentials* channel_peer,
                                           uint64_t fingerprint, SequenceRec& s, Prepared& prep,
                                           std::shared_ptr<const v1::TierPlan>& replay) {
  // Again: the lease may have lapsed, or the sequence been closed, while waiting for plan_mu.
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id(), r.session_secret(),
                                                     channel_peer ? Via::kChannel : Via::kRpc));
  if (s.closed) return Closed(s.id);
  const bool replayed_ack =
      r.applied_plan_version() != 0 && r.applied_plan_version() == s.last_applied &&
      (!s.pending.has_value() || s.pending->version != r.applied_plan_version());
  if (r.applied_plan_version() != 0 && !replayed_ack) {
    // Exactly an AckPlan ahead of the snapshot: it stands even if the snapshot is refused.
    RETURN_IF_ERROR(
        AcknowledgeLocked(*w, s, r.applied_plan_version(), true, "applied_plan_version"));
    UpdateGaugesLocked();  // the freed sources show even if the snapshot is refused below
  }
  if (!r.abandon_pending() && s.pending.has_value() &&
      s.pending->snapshot_fingerprint == fingerprint) {
    replay = s.pending->sent;
    return absl::OkStatus();
  }
  if (r.abandon_pending() && s.pending.has_value()) {
    // The worker never saw this plan (its reply was lost): refused, so its destinations return.
    RETURN_IF_ERROR(AcknowledgeLocked(*w, s, s.pending->version, false, "abandon_pending"));
    if (metrics_ != nullptr) metrics_->CountAbandonedPlan();
    UpdateGaugesLocked();
  }
  RETURN_IF_ERROR(CheckAgainstRecord(s, r));
  if (hooks_.holding_core_lock) hooks_.holding_core_lock(s.id);
  // What the unlocked phase validates, grows and measures (a copy: the record is not read there).
  prep.sequence_id = s.id;
  prep.version = s.next_version;
  prep.fingerprint = fingerprint;
  prep.policy = s.policy;
  prep.geometry = w->geometry;
  prep.page_bytes = w->page_bytes;
  prep.prompt_tokens = s.prompt_tokens;
  prep.protected_prompt_begin = s.protected_prompt_begin;
  prep.length = r.length();
  prep.current = s.placement;
  prep.max_entries = options_.max_snapshot_entries;
  prep.max_plan_bytes = edge::MaxPlanBytes(options_.max_snapshot_entries);
  return absl::OkStatus();
}

absl::Status DaemonCoreImpl::CheckEntryBudgetLocked(const WorkerRec& w, const SequenceRec& s,
                                                    uint64_t entries) const {
  if (entries <= s.entries()) return absl::OkStatus();
  const uint64_t growth = entries - s.entries();
  auto refuse = [&](absl::string_view whose, uint64_t held, absl::string_view limit, uint64_t max) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "snapshot of ", entries, " entries (layer_groups x num_pages) for sequence_id ", s.id, ": ",
        whose, " would hold ", held + growth, " snapshot entries, over ", limit, " (", max,
        "); close sequences first"));
  };
  if (w.entries + growth > options_.max_worker_entries) {
    return refuse(absl::StrCat("worker_id ", w.id, "'s sequences"), w.entries,
                  "limits.max_worker_entries", options_.max_worker_entries);
  }
  if (total_entries_ + growth > options_.max_node_entries) {
    return refuse("the node's sequences", total_entries_, "limits.max_node_entries",
                  options_.max_node_entries);
  }
  return absl::OkStatus();
}

std::array<uint32_t, 2> DaemonCoreImpl::ExtentsToMakeLocked(const SequenceRec& s,
                                                            const Prepared& prep) {
  std::array<uint32_t, 2> make{};
  if (s.closed) return make;
  const WorkerRec& w = workers_.at(s.worker_id);
  std::array<uint64_t, 2> need{};
  const std::vector<Tier>& target = prep.decision.target.tiers;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != s.placement.tiers[i] && InPool(target[i])) ++need[PoolIndex(target[i])];
  }
  for (int p = 0; p < 2; ++p) {
    if (need[p] == 0) continue;
    PoolBudget& budget = *pools_[p];
    const uint64_t quota =
        p == 0 ? options_.worker_ddr_quota_bytes : options_.worker_compressed_quota_bytes;
    if (quota > 0) {  // no extent for slots the quota would refuse
      const uint64_t slot = (w.page_bytes[p] + layout::kSlotAlignment - 1) /
                            layout::kSlotAlignment * layout::kSlotAlignment;
      need[p] = std::min(need[p], (quota - std::min(quota, w.pool_bytes[p])) / slot);
    }
    // Spares are of the pool's memory: a worker that asked for memfd gets its extents made.
    if (w.memory[p]->memory() != budget.memory()) continue;
    const uint64_t wanted = w.memory[p]->ExtentsWanted(need[p], w.page_bytes[p]);
    while (budget.ready_spares() + make[p] < wanted && budget.CanReserve()) {
      budget.BeginSpare();
      ++make[p];
    }
  }
  return make;
}

bool DaemonCoreImpl::MakeSpare(PoolBudget& budget) {
  // What MakeExtent reads never changes after construction.
  absl::StatusOr<Extent> made = budget.MakeExtent(budget.memory());
  const bool ok = made.ok();
  PiMutexLock lock(&mu_);
  budget.EndSpare(std::move(made));
  UpdateGaugesLocked();
  return ok;
}

absl::StatusOr<std::shared_ptr<v1::TierPlan>> DaemonCoreImpl::PlanLocked(SequenceRec& s,
                                                                         Prepared& prep) {
  if (s.closed) return Closed(s.id);
  WorkerRec& w = workers_.at(s.worker_id);  // an open sequence's worker is registered
  Placement& target = prep.decision.target;
  SlotMap dst = GrantDestinationsLocked(w, s, prep.scores, target, &prep.shortage);
  auto plan = std::make_shared<v1::TierPlan>();
  absl::Status built = BuildPlanLocked(w, s, dst, prep, *plan);
  if (!built.ok()) {
    for (auto& [i, slot] : dst) ReleaseLocked(w, slot);
    UpdateGaugesLocked();
    return built;
  }
  PendingPlan pending;
  pending.version = prep.version;
  pending.moves.reserve(prep.moves.size());
  for (const tiering::Move& m : prep.moves) {
    auto it = dst.find(m.group * s.placement.num_pages + m.page);
    pending.moves.push_back({m, it != dst.end() ? std::move(it->second) : Slot()});
  }
  pending.figures = prep.figures;
  if (prep.schedule.has_value()) {
    w.scheduled_bytes += prep.schedule->scheduled_bytes - s.scheduled_bytes;
    s.scheduled_bytes = prep.schedule->scheduled_bytes;
    w.h2d_grant = prep.schedule->h2d_grant;
  }
  pending.sent = plan;
  pending.snapshot_fingerprint = prep.fingerprint;
  s.pending = std::move(pending);
  ++s.next_version;
  const absl::Duration now = clock_->Now();
  s.plans.Add(now, plan->degraded());
  w.plans.Add(now, plan->degraded());
  UpdateGaugesLocked();
  return plan;
}

absl::Status DaemonCoreImpl::BuildPlanLocked(const WorkerRec& w, const SequenceRec& s,
                                             const SlotMap& dst, Prepared& prep,
                                             v1::TierPlan& plan) {
  const Placement& current = s.placement;
  const Placement& target = prep.decision.target;
  ASSIGN_OR_RETURN(prep.moves, OrderedMoves(current, target));
  plan.set_sequence_id(s.id);
  plan.set_plan_version(prep.version);
  std::string* target_tiers = plan.mutable_target_tiers();
  target_tiers->resize(target.tiers.size());
  std::transform(target.tiers.begin(), target.tiers.end(), target_tiers->begin(),
                 [](Tier t) { return static_cast<char>(t); });
  const int n = static_cast<int>(prep.moves.size());
  plan.mutable_move_group()->Reserve(n);
  plan.mutable_move_page()->Reserve(n);
  plan.mutable_move_dst_slot()->Reserve(n);
  plan.mutable_move_src_slot()->Reserve(n);
  std::string* from_bytes = plan.mutable_move_from();
  std::string* to_bytes = plan.mutable_move_to();
  auto offset = [](const SlotMap& slots, uint32_t i) -> uint64_t {
    auto it = slots.find(i);
    return it != slots.end() && it->second.valid() ? it->second.offset() : 0;
  };
  for (const tiering::Move& m : prep.moves) {
    const uint32_t i = m.group * current.num_pages + m.page;
    plan.add_move_group(m.group);
    plan.add_move_page(m.page);
    from_bytes->push_back(static_cast<char>(m.from));
    to_bytes->push_back(static_cast<char>(m.to));
    plan.add_move_dst_slot(offset(dst, i));
    plan.add_move_src_slot(offset(s.slots, i));
  }
  if (prep.shortage.total() > 0) {
    plan.set_degraded(true);
    plan.set_degraded_reason(
        DegradedReason(prep.shortage, {pools_[0]->last_failure(), pools_[1]->last_failure()}));
  }
  plan.set_protected_overflow(prep.decision.protected_overflow);
  if (w.link.declared()) {
    prep.schedule = ScheduleLocked(w, s, target);
  }
  plan.set_ddr_extents(w.memory[0]->num_extents());
  plan.set_compressed_extents(w.memory[1]->num_extents());
  prep.figures = ComputeFigures(prep.geometry, target, prep.prompt_tokens, prep.length);
  prep.figures.ToProto(plan.mutable_report());
  // Never record a plan that could not be sent.
  const uint64_t plan_bytes =
      plan.ByteSizeLong() +
      (prep.schedule ? ScheduleBytesBound(target.num_groups, prep.schedule->pooled_pages) : 0);
  if (plan_bytes > prep.max_plan_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "plan of ", plan_bytes, " bytes exceeds the message limit (", prep.max_plan_bytes, ")"));
  }
  return absl::OkStatus();
}

void DaemonCoreImpl::CountPlan(const Prepared& prep) const {
  for (const tiering::Move& m : prep.moves) {
    metrics_->CountMove(tiering::KindOf(m.from, m.to),
                        MoveBytes(prep.geometry, prep.page_bytes, m));
  }
  for (int k = 0; k < 3; ++k) {
    if (prep.shortage.pages[k] > 0) {
      metrics_->CountDegraded(static_cast<Metrics::DegradeReason>(k));
    }
  }
  if (prep.decision.protected_overflow) metrics_->CountProtectedOverflow();
}

absl::StatusOr<v1::AckPlanResponse> DaemonCoreImpl::AckPlan(const v1::AckPlanRequest& request) {
  PiMutexLock lock(&mu_);
  return Count(Metrics::Rpc::kAckPlan, AckLocked(request));
}

absl::StatusOr<v1::AckPlanResponse> DaemonCoreImpl::AckLocked(const v1::AckPlanRequest& r) {
  ASSIGN_OR_RETURN(WorkerRec * w, AuthenticateLocked(r.worker_id(), r.session_secret()));
  ASSIGN_OR_RETURN(std::shared_ptr<SequenceRec> s, FindSequenceLocked(*w, r.sequence_id()));
  // A replayed ack (the first one's reply was lost) settles nothing twice.
  const bool settled = !s->pending.has_value() && r.plan_version() != 0 &&
                       r.plan_version() == (r.applied() ? s->last_applied : s->last_acked);
  if (settled) return v1::AckPlanResponse();
  RETURN_IF_ERROR(AcknowledgeLocked(*w, *s, r.plan_version(), r.applied(), "plan_version"));
  UpdateGaugesLocked();
  return v1::AckPlanResponse();
}

absl::Status DaemonCoreImpl::AcknowledgeLocked(WorkerRec& w, SequenceRec& s, uint64_t version,
                                               bool applied, absl::string_view field) {
  if (!s.pending.has_value() || s.pending->version != version) {
    return Precondition(absl::StrCat(
        field, " ", version, " is not the plan in flight for sequence_id ", s.id,
        s.pending.has_value() ? absl::StrCat(" (", s.pending->version, ")") : " (none)"));
  }
  if (applied) {
    CommitLocked(w, s);
  } else {
    for (PendingMove& m : s.pending->moves) ReleaseLocked(w, m.dst);
  }
  s.last_acked = version;
  if (applied) s.last_applied = version;
  s.pending.reset();
  if (metrics_ != nullptr) metrics_->CountAck(applied);
  return absl::OkStatus();
}

void DaemonCoreImpl::CommitLocked(WorkerRec& w, SequenceRec& s) {
  uint64_t newly_evicted = 0;
  for (PendingMove& m : s.pending->moves) {
    const uint32_t i = m.move.group * s.placement.num_pages + m.move.page;
    if (auto it = s.slots.find(i); it != s.slots.end()) {
      ReleaseLocked(w, it->second);  // the source copy is no longer needed
      s.slots.erase(it);
    }
    if (m.dst.valid()) s.slots.emplace(i, std::move(m.dst));
    s.placement.tiers[i] = m.move.to;
  }
  newly_evicted =
      s.pending->figures.tokens[3] - std::min(s.pending->figures.tokens[3], s.figures.tokens[3]);
  if (metrics_ != nullptr && newly_evicted > 0) metrics_->CountEvictedTokens(newly_evicted);
  SetFiguresLocked(s, s.pending->figures);
}

}  // namespace kvtier::daemon::internal

namespace kvtier::daemon::internal {

absl::Status DaemonCoreImpl::CheckInvariants() const {
  PiMutexLock lock(&mu_);
  std::array<uint64_t, 2> pool_bytes{};
  std::array<uint64_t, 2> extents{};
  std::array<uint64_t, tiering::kNumTiers> tokens{};
  uint64_t full = 0, t0 = 0;
  uint64_t node_entries = 0;
  for (const auto& [wid, w] : workers_) {
    std::array<uint64_t, 2> held{};
    uint64_t scheduled = 0, entries = 0;
    for (uint64_t sid : w.sequences) {
      auto it = sequences_.find(sid);
      if (it == sequences_.end() || it->second->worker_id != wid) {
        return absl::InternalError(absl::StrCat("worker ", wid, " lists sequence ", sid));
      }
      const SequenceRec& s = *it->second;
      size_t pooled_pages = 0;
      for (size_t i = 0; i < s.placement.tiers.size(); ++i) {
        const bool pooled = InPool(s.placement.tiers[i]);
        auto it = s.slots.find(static_cast<uint32_t>(i));
        if (pooled != (it != s.slots.end() && it->second.valid())) {
          return absl::InternalError(absl::StrCat("sequence ", sid, " page ", i, " slot/tier"));
        }
        if (pooled) {
          ++pooled_pages;
          if (PoolOf(it->second) != PoolIndex(s.placement.tiers[i])) {
            return absl::InternalError(absl::StrCat("sequence ", sid, " page ", i, " wrong pool"));
          }
          held[PoolOf(it->second)] += it->second.bytes();
        }
      }
      if (pooled_pages != s.slots.size()) return absl::InternalError("slots of unpooled pages");
      entries += s.entries();
      if (s.pending.has_value()) {
        for (const PendingMove& m : s.pending->moves) {
          if (InPool(m.move.to) != m.dst.valid()) return absl::InternalError("pending dst");
          if (m.dst.valid()) held[PoolOf(m.dst)] += m.dst.bytes();
        }
      }
      scheduled += s.scheduled_bytes;
      for (int t = 0; t < tiering::kNumTiers; ++t) tokens[t] += s.figures.tokens[t];
      full += s.figures.full_bytes;
      t0 += s.figures.t0_bytes;
    }
    if (held != w.pool_bytes) {
      return absl::InternalError(absl::StrCat("worker ", wid, " accounting: holds ", held[0], "/",
                                              held[1], ", recorded ", w.pool_bytes[0], "/",
                                              w.pool_bytes[1]));
    }
    if (entries != w.entries) {
      return absl::InternalError(
          absl::StrCat("worker ", wid, " holds ", entries, " entries, recorded ", w.entries));
    }
    node_entries += entries;
    if (scheduled != w.scheduled_bytes) {
      return absl::InternalError(absl::StrCat("worker ", wid, " schedules ", w.scheduled_bytes,
                                              " bytes, its sequences ", scheduled));
    }
    pool_bytes[0] += held[0];
    pool_bytes[1] += held[1];
    for (int i = 0; i < 2; ++i) {
      RETURN_IF_ERROR(w.memory[i]->CheckInvariants());
      extents[i] += w.memory[i]->num_extents();
    }
  }
  size_t listed = 0;
  for (const auto& [wid, w] : workers_) listed += w.sequences.size();
  if (listed != sequences_.size()) return absl::InternalError("orphan sequences");
  std::array<uint64_t, 2> draining{};
  for (const DrainingMemory& d : draining_) {
    for (int i = 0; i < 2; ++i) {
      extents[i] += d.extents[i].size();
      for (const Extent& e : d.extents[i]) draining[i] += e.bytes();
    }
  }
  if (draining != draining_bytes_) return absl::InternalError("draining bytes");
  for (int i = 0; i < 2; ++i) {
    if (pool_bytes[i] != used_bytes_[i]) {
      return absl::InternalError(
          absl::StrCat("pool ", i, " used ", used_bytes_[i], " but workers hold ", pool_bytes[i]));
    }
    extents[i] += pools_[i]->unassigned();
    if (extents[i] * pools_[i]->extent_bytes() != pools_[i]->reserved_bytes()) {
      return absl::InternalError(absl::StrCat("pool ", i, " reserves ", pools_[i]->reserved_bytes(),
                                              " but workers hold ", extents[i], " extents"));
    }
  }
  if (node_entries != total_entries_) return absl::InternalError("entry totals drifted");
  if (tokens != total_tokens_ || full != total_full_bytes_ || t0 != total_t0_bytes_) {
    return absl::InternalError("figure totals drifted");
  }
  return absl::OkStatus();
}

}  // namespace kvtier::daemon::internal
