#include "worker/runtime/tiered_sequence.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/status/status_macros.h"
#include "core/tiering/plan.h"
#include "kvtier/client.h"
#include "worker/page_pool.h"
#include "worker/runtime/daemon_pools.h"
#include "worker/runtime/schedule_follow.h"

namespace kvtier::worker {
namespace {

using tiering::Tier;

uint64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Adds the elapsed time of its scope to a counter.
class ScopedTimer {
 public:
  explicit ScopedTimer(uint64_t* sink) : sink_(sink), start_(NowNanos()) {}
  ~ScopedTimer() { *sink_ += NowNanos() - start_; }

 private:
  uint64_t* sink_;
  uint64_t start_;
};

}  // namespace

TieredSequence::TieredSequence(SequenceOptions options, std::unique_ptr<TieredKvStore> store,
                               tiering::ScoreAccumulator scores,
                               std::unique_ptr<tiering::Policy> policy)
    : options_(std::move(options)),
      store_(std::move(store)),
      scores_(std::move(scores)),
      policy_(std::move(policy)),
      layer_mass_(store_->geometry().num_layers) {
  report_.prompt_tokens = options_.prompt_tokens;
}

TieredSequence::~TieredSequence() {
  lane_.reset();  // its queued acks run first
  ReleaseHeldSlots();
}

void TieredSequence::ReleaseHeldSlots() {
  if (client_ != nullptr) {
    // The daemon frees every slot of the sequence; an orphaned one is reaped with its lease.
    if (!orphaned_) (void)client_->CloseSequence(sequence_id_);
    return;
  }
  if (local_slots_ == nullptr) return;
  for (const ReleasedSlot& slot : store_->HeldSlots()) {
    (void)local_slots_->Free(slot.kind, slot.offset);
  }
}

absl::Status TieredSequence::Append(uint32_t layer, const float* k, const float* v, uint32_t n) {
  return store_->Append(layer, k, v, n);
}

absl::Status TieredSequence::Append(uint32_t layer, const float* k, RowStrides k_strides,
                                    const float* v, RowStrides v_strides, uint32_t n) {
  return store_->Append(layer, k, k_strides, v, v_strides, n);
}

absl::Status TieredSequence::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                    float* position_mass) {
  return Attend(layer, q, n, out, position_mass, AttendMask{});
}

absl::Status TieredSequence::Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                                    float* position_mass, const AttendMask& mask,
                                    RowStrides q_strides) {
  if (layer >= layer_mass_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  // A device-score backend keeps the mass on the device (read at re-tiering) and refuses a
  // position_mass; the host one hands it over per layer, to be added up at the pass's end.
  const bool device_scores = store_->backend().device_scores();
  std::vector<float>& mass = layer_mass_[layer];
  if (!device_scores) mass.resize(store_->Length(layer));
  {
    ScopedTimer timer(&report_.attend_nanos);
    RETURN_IF_ERROR(store_->Attend(layer, q, n, out, device_scores ? position_mass : mass.data(),
                                   mask, q_strides));
  }
  if (position_mass != nullptr) std::copy(mass.begin(), mass.end(), position_mass);
  if (layer + 1 == layer_mass_.size()) return EndForwardPass(n);
  return absl::OkStatus();
}

absl::Status TieredSequence::AttendShared(uint32_t layer, uint32_t n, const float* position_mass) {
  if (layer >= layer_mass_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (store_->backend().device_scores()) {
    return absl::FailedPreconditionError("a shared attention needs host scores");
  }
  const tiering::Placement placement = store_->placement();
  for (tiering::Tier t : placement.tiers) {
    if (t != tiering::Tier::kT0) {
      return absl::FailedPreconditionError("a shared attention needs every page in T0");
    }
  }
  layer_mass_[layer].assign(position_mass, position_mass + store_->Length(layer));
  if (layer + 1 == layer_mass_.size()) return EndForwardPass(n);
  return absl::OkStatus();
}

absl::Status TieredSequence::AttendBatch(const std::vector<TieredSequence*>& sequences,
                                         uint32_t layer, const float* q, float* out) {
  std::vector<TieredKvStore*> stores;
  std::vector<float*> masses;
  for (size_t i = 0; i < sequences.size(); ++i) {
    TieredSequence* seq = sequences[i];
    if (seq == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sequences[", i, "] is null"));
    }
    if (layer >= seq->layer_mass_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequences[", i, "]: layer ", layer, " out of range"));
    }
    stores.push_back(seq->store_.get());
    // The host backend hands the mass over per layer (added up at the pass's end).
    if (!seq->store_->backend().device_scores()) {
      std::vector<float>& mass = seq->layer_mass_[layer];
      mass.resize(seq->store_->Length(layer));
      masses.push_back(mass.data());
    }
  }
  if (!masses.empty() && masses.size() != stores.size()) {
    return absl::InvalidArgumentError("sequences must all keep scores on the device, or none");
  }
  const uint64_t start = NowNanos();
  absl::Status attended = TieredKvStore::AttendBatch(stores, layer, q, out, masses);
  if (!attended.ok()) {
    return absl::Status(attended.code(),
                        absl::StrReplaceAll(attended.message(), {{"stores[", "sequences["}}));
  }
  const uint64_t share = (NowNanos() - start) / sequences.size();
  absl::Status s;
  for (TieredSequence* seq : sequences) {
    seq->report_.attend_nanos += share;
    if (layer + 1 == seq->layer_mass_.size()) {
      absl::Status ended = seq->EndForwardPass(1);
      if (s.ok()) s = ended;
    }
  }
  return s;
}

absl::Status TieredSequence::AddHostScores() {
  const uint64_t length = store_->Length(0);
  std::vector<float>& attention = step_attention_;
  attention.clear();
  for (const auto& mass : layer_mass_) {
    if (mass.size() != length) {
      return absl::FailedPreconditionError("layers attended over different lengths");
    }
    attention.insert(attention.end(), mass.begin(), mass.end());
  }
  return prefilled_ ? scores_.AddStep(attention, length, tiering::AttentionLayout::kHeadSummed)
                    : scores_.SeedPrefill(attention, length, tiering::AttentionLayout::kHeadSummed);
}

absl::Status TieredSequence::PullDeviceScores() {
  if (!store_->backend().device_scores()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<std::vector<float>> gained, store_->TakeDeviceScores());
  for (uint32_t g = 0; g < gained.size(); ++g) RETURN_IF_ERROR(scores_.AddScores(g, gained[g]));
  return absl::OkStatus();
}

absl::Status TieredSequence::EndForwardPass(uint32_t n) {
  if (!store_->backend().device_scores()) RETURN_IF_ERROR(AddHostScores());
  MeasureStep();
  // The daemon hears the length with the next heartbeat, not only at the next re-tiering.
  if (client_ != nullptr && !orphaned_)
    client_->ReportSequenceLength(sequence_id_, store_->Length(0));
  if (!prefilled_) {
    prefilled_ = true;
    step_ = 0;
  } else {
    ++step_;
  }
  // Daemon mode: a plan that arrived since the last pass is applied at this step boundary, and a
  // re-tiering step only queues its snapshot (DaemonLane). Local mode plans in place.
  absl::Status s = lane_ != nullptr ? CollectPlan() : absl::OkStatus();
  if (s.ok() && tiering::IsRetierStep(options_.tiering, step_)) {
    s = lane_ != nullptr && !options_.wait_for_plans ? StartRetier() : Retier();
  }
  Account();
  return s;
}

absl::Status TieredSequence::Retier() {
  ScopedTimer timer(&report_.tier_nanos);
  if (client_ == nullptr) return RetierLocal(/*allow_offloads=*/true);
  FollowSession();
  if (!orphaned_) {
    absl::Status s = RetierWithDaemon();
    exchange_failed_ = !s.ok();
    if (s.ok()) return s;
    if (client_->generation() != generation_) orphaned_ = true;
  }
  // The daemon is unreachable (or forgot us): keep decoding on what we hold, no new offloads.
  ++report_.degraded_plans;
  return RetierLocal(/*allow_offloads=*/false);
}

void TieredSequence::FollowSession() {
  if (client_->generation() == generation_) return;
  orphaned_ = true;
  // Re-open once the new session is up and no snapshot of the old one is still out.
  if (!client_->connected() || (lane_ != nullptr && lane_->snapshot_in_flight())) return;
  if (lane_ != nullptr) lane_->Drain();  // acks of the old session go first (they fail: it is gone)
  if (Rejoin().ok()) orphaned_ = false;
}

absl::Status TieredSequence::Rejoin() {
  const uint64_t generation = client_->generation();
  std::shared_ptr<PoolMapping> ddr = client_->pool(v1::POOL_KIND_DDR);
  std::shared_ptr<PoolMapping> compressed = client_->pool(v1::POOL_KIND_COMPRESSED);
  if (ddr == nullptr || compressed == nullptr) return absl::UnavailableError("no pools yet");
  // Pages in the old session's memory come home first (exact copies; T2 pages keep their
  // 8-bit values), so nothing depends on memory the daemon no longer accounts for.
  RETURN_IF_ERROR(PromoteAll());
  auto ddr_pool = PoolOverMapping(PoolKind::kDdr, ddr);
  auto compressed_pool = PoolOverMapping(PoolKind::kCompressed, compressed);
  ASSIGN_OR_RETURN(uint64_t id,
                   client_->OpenSequence(options_.prompt_tokens, wire_policy_, options_.tag,
                                         store_->Length(0), options_.protected_prompt_begin));
  RETURN_IF_ERROR(store_->RebindPools(ddr_pool.get(), compressed_pool.get()));
  ddr_pool_ = std::move(ddr_pool);
  compressed_pool_ = std::move(compressed_pool);
  ddr_mapping_ = std::move(ddr);
  compressed_mapping_ = std::move(compressed);
  sequence_id_ = id;
  generation_ = generation;
  acked_version_ = 0;
  daemon_length_ = 0;
  exchange_failed_ = false;
  ++rejoins_;
  return absl::OkStatus();
}

absl::Status TieredSequence::PromoteAll() {
  const tiering::Placement current = store_->placement();
  std::vector<tiering::Move> promotions;
  for (uint32_t g = 0; g < current.num_groups; ++g) {
    for (uint32_t p = 0; p < current.num_pages; ++p) {
      const Tier t = current.at(g, p);
      if (t == Tier::kT1 || t == Tier::kT2) promotions.push_back({g, p, t, Tier::kT0});
    }
  }
  if (promotions.empty()) return absl::OkStatus();
  if (local_slots_ != nullptr) return store_->ApplyPlanLocal(promotions, *local_slots_);
  return store_->ApplyPlan(promotions, std::vector<SlotAssignment>(promotions.size()));
}

absl::Status TieredSequence::Truncate(uint32_t length) {
  const uint32_t now = store_->Length(0);
  if (length > now) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", length, " exceeds the sequence's ", now));
  }
  if (length == now) return absl::OkStatus();
  const uint32_t pt = store_->geometry().page_tokens;
  const tiering::Placement current = store_->placement();
  // The page that keeps some rows: refused when evicted, promoted when in T2 (appends write
  // T0, or T1 in place on the host; on a device only T0).
  const bool appends_to_t1 = store_->backend().host_t0();
  std::vector<tiering::Move> promote;
  if (length % pt != 0) {
    const uint32_t page = length / pt;
    for (uint32_t g = 0; g < current.num_groups && page < current.num_pages; ++g) {
      const Tier t = current.at(g, page);
      if (t == Tier::kT3) return store_->Truncate(length, nullptr);  // FAILED_PRECONDITION
      if (t == Tier::kT2 || (t == Tier::kT1 && !appends_to_t1)) {
        promote.push_back({g, page, t, Tier::kT0});
      }
    }
  }
  RETURN_IF_ERROR(PullDeviceScores());  // the device's scores of dropped positions go too
  const bool reopen = daemon_backed() && length < daemon_length_;
  if (daemon_backed() && lane_ != nullptr) {
    lane_->Drain();  // the snapshot out and its plan first: both speak of the old length
    RETURN_IF_ERROR(CollectPlan());
  }
  if (reopen) {
    RETURN_IF_ERROR(PromoteAll());
  } else if (!promote.empty()) {
    // Local pools take the slot back; an orphaned sequence's belongs to the old session.
    RETURN_IF_ERROR(local_slots_ != nullptr
                        ? store_->ApplyPlanLocal(promote, *local_slots_)
                        : store_->ApplyPlan(promote, std::vector<SlotAssignment>(promote.size())));
  }
  std::vector<ReleasedSlot> released;
  RETURN_IF_ERROR(store_->Truncate(length, &released));
  if (local_slots_ != nullptr) {
    for (const ReleasedSlot& slot : released) (void)local_slots_->Free(slot.kind, slot.offset);
  }
  RETURN_IF_ERROR(scores_.Truncate(length));
  for (std::vector<float>& mass : layer_mass_) mass.clear();
  options_.prompt_tokens = std::min<uint64_t>(options_.prompt_tokens, length);
  report_.prompt_tokens = options_.prompt_tokens;
  if (reopen) {
    // kvtierd's lengths only grow: a new daemon sequence for the shorter one (this one's slots
    // are all back in T0, so closing it frees nothing we still read).
    (void)client_->CloseSequence(sequence_id_);
    acked_version_ = 0;
    daemon_length_ = 0;
    exchange_failed_ = false;
    absl::StatusOr<uint64_t> id = client_->OpenSequence(
        options_.prompt_tokens, wire_policy_, options_.tag, 0, options_.protected_prompt_begin);
    if (id.ok()) {
      sequence_id_ = *id;
    } else {
      // As after a lost session: decode on what we hold (all in T0), re-open at a later
      // re-tiering (FollowSession sees a generation it never joined).
      orphaned_ = true;
      generation_ = 0;
    }
  }
  Account();
  return absl::OkStatus();
}

absl::StatusOr<tiering::Placement> TieredSequence::LocalTarget(
    const std::vector<float>& page_scores, bool allow_offloads) {
  const tiering::Placement current = store_->placement();
  tiering::SequenceState state{options_.prompt_tokens, store_->Length(0),
                               options_.protected_prompt_begin};
  ASSIGN_OR_RETURN(tiering::Decision decision,
                   policy_->DecideDetailed({state, current, page_scores}));
  report_.protected_overflow_plans += decision.protected_overflow_tokens > 0;
  if (allow_offloads) return std::move(decision.placement);
  // Without the daemon's slots only evictions can proceed: they need no destination, and the
  // policy's eviction budget is the same wherever it runs.
  tiering::Placement target = decision.placement;
  for (uint32_t g = 0; g < target.num_groups; ++g) {
    for (uint32_t p = 0; p < target.num_pages; ++p) {
      const Tier now = p < current.num_pages ? current.at(g, p) : Tier::kT0;
      if (target.at(g, p) != Tier::kT3) target.at(g, p) = now;
    }
  }
  return target;
}

absl::Status TieredSequence::RetierLocal(bool allow_offloads) {
  RETURN_IF_ERROR(PullDeviceScores());
  ASSIGN_OR_RETURN(
      std::vector<float> page_scores,
      scores_.AllPageScores(store_->geometry().page_tokens, options_.tiering.page_score));
  MeasureLostMass(page_scores);
  ASSIGN_OR_RETURN(tiering::Placement target, LocalTarget(page_scores, allow_offloads));
  ASSIGN_OR_RETURN(tiering::Plan plan, tiering::MakePlan(store_->placement(), target));
  if (local_slots_ != nullptr) {
    lost_mass_meter_.MeasureCompression(*store_, plan.moves);
    RETURN_IF_ERROR(store_->ApplyPlanLocal(plan.moves, *local_slots_));
  } else {
    // Evictions only (orphaned daemon sequence): the released slots belong to the old daemon.
    std::vector<SlotAssignment> none(plan.moves.size());
    RETURN_IF_ERROR(store_->ApplyPlan(plan.moves, none));
  }
  ++report_.plans;
  ++report_.local_plans;
  return scores_.FreezeEvicted(target, store_->geometry().page_tokens);
}

absl::StatusOr<v1::SubmitSnapshotRequest> TieredSequence::BuildSnapshot() {
  RETURN_IF_ERROR(PullDeviceScores());
  const layout::KvGeometry& g = store_->geometry();
  ASSIGN_OR_RETURN(std::vector<float> page_scores,
                   scores_.AllPageScores(g.page_tokens, options_.tiering.page_score));
  MeasureLostMass(page_scores);
  const tiering::Placement current = store_->placement();
  v1::SubmitSnapshotRequest snapshot;
  snapshot.set_sequence_id(sequence_id_);
  snapshot.set_length(store_->Length(0));
  daemon_length_ = store_->Length(0);
  snapshot.set_decode_step(step_);
  snapshot.set_num_pages(current.num_pages);
  snapshot.set_last_plan_version(acked_version_);
  // The ack of the last plan applied may not have arrived (a lost exchange, or one still queued
  // or failed in the background): carry it, replaying is harmless. After a lost exchange a plan
  // the daemon made for a lost snapshot never reached us: abandon it.
  if (exchange_failed_ || (lane_ != nullptr && !lane_->acks_confirmed())) {
    snapshot.set_applied_plan_version(acked_version_);
  }
  if (exchange_failed_) snapshot.set_abandon_pending(true);
  snapshot.mutable_lost_mass()->set_compressed(report_.lost_mass.compressed);
  snapshot.mutable_lost_mass()->set_evicted_estimate(report_.lost_mass.evicted);
  snapshot.mutable_page_scores()->Assign(page_scores.begin(), page_scores.end());
  std::string tiers(current.tiers.size(), '\0');
  for (size_t i = 0; i < tiers.size(); ++i) tiers[i] = static_cast<char>(current.tiers[i]);
  snapshot.set_current_tiers(std::move(tiers));
  return snapshot;
}

absl::Status TieredSequence::RetierWithDaemon() {
  if (lane_ != nullptr) {
    // Whatever the lane still carries goes first; a plan it brought is applied (or dropped).
    lane_->Drain();
    RETURN_IF_ERROR(CollectPlan());
  }
  ASSIGN_OR_RETURN(v1::SubmitSnapshotRequest snapshot, BuildSnapshot());
  ASSIGN_OR_RETURN(v1::TierPlan plan, client_->SubmitSnapshot(std::move(snapshot)));
  return ApplyDaemonPlan(plan, /*background_ack=*/false);
}

absl::Status TieredSequence::ApplyDaemonPlan(const v1::TierPlan& plan, bool background_ack) {
  const layout::KvGeometry& g = store_->geometry();
  auto ack = [&](bool applied, const std::string& error) -> absl::Status {
    if (background_ack) {
      lane_->Ack(sequence_id_, plan.plan_version(), applied, error);
      return absl::OkStatus();
    }
    return client_->AckPlan(sequence_id_, plan.plan_version(), applied, error);
  };
  const int n = plan.move_page_size();
  if (plan.move_group_size() != n || static_cast<int>(plan.move_from().size()) != n ||
      static_cast<int>(plan.move_to().size()) != n || plan.move_dst_slot_size() != n) {
    (void)ack(false, "plan arrays differ");
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", plan.plan_version(), ": move arrays have different lengths"));
  }
  std::vector<tiering::Move> moves(n);
  std::vector<SlotAssignment> slots(n);
  for (int i = 0; i < n; ++i) {
    moves[i] = {plan.move_group(i), plan.move_page(i), static_cast<Tier>(plan.move_from()[i]),
                static_cast<Tier>(plan.move_to()[i])};
    slots[i].dst_offset = plan.move_dst_slot(i);
  }
  lost_mass_meter_.MeasureCompression(*store_, moves);
  absl::Status applied = store_->ApplyPlan(moves, slots);
  absl::Status acked = ack(applied.ok(), std::string(applied.message()));
  if (!applied.ok()) return applied;
  // Applied: the store is in the plan's placement whether or not the ack arrived. A lost ack is
  // carried by the next snapshot, so the plan counts as done here.
  acked_version_ = plan.plan_version();
  exchange_failed_ = !acked.ok();
  ++report_.plans;
  report_.degraded_plans += plan.degraded();
  report_.protected_overflow_plans += plan.protected_overflow();
  RETURN_IF_ERROR(scores_.FreezeEvicted(store_->placement(), g.page_tokens));
  // A refused schedule is counted and leaves attention whole: the plan itself stands.
  (void)FollowSchedule(plan.plan_version(), plan.schedule());  // unset: the empty schedule
  return acked;
}

absl::Status TieredSequence::FollowSchedule(uint64_t plan_version,
                                            const v1::PrefetchSchedule& schedule) {
  // No groups: no link declared, nothing to follow (every page attended whole).
  absl::StatusOr<FollowedSchedule> followed =
      plan_version != acked_version_ ? absl::FailedPreconditionError(absl::StrCat(
                                           "schedule of plan ", plan_version, " is stale: plan ",
                                           acked_version_, " is in force"))
      : schedule.groups_size() == 0  ? absl::StatusOr<FollowedSchedule>(FollowedSchedule{})
                                     : CheckSchedule(schedule, *store_);
  absl::Status s = followed.ok() ? store_->SetSchedule(followed->pages) : followed.status();
  if (!s.ok()) {
    ++report_.schedules_refused;
    (void)store_->SetSchedule({});
    followed = FollowedSchedule{};
  } else if (schedule.groups_size() > 0) {
    ++report_.schedules;
  }
  report_.resident_bytes = followed->resident_bytes;
  report_.stage_bytes = followed->stage_bytes;
  report_.in_place_bytes = followed->in_place_bytes;
  return s;
}

void TieredSequence::MeasureStep() {
  const uint64_t now = NowNanos();
  const uint64_t last = last_pass_nanos_;
  last_pass_nanos_ = now;
  // Decode steps only: the pass before is a step too, and a prefill is not one.
  if (!prefilled_ || last == 0 || client_ == nullptr) return;
  const double step = static_cast<double>(now - last) / 1e9;
  step_seconds_ = step_seconds_ == 0 ? step : 0.9 * step_seconds_ + 0.1 * step;
  client_->ReportStepSeconds(step_seconds_);
}

absl::Status TieredSequence::StartRetier() {
  ScopedTimer timer(&report_.tier_nanos);
  FollowSession();
  if (orphaned_) {
    ++report_.degraded_plans;
    return RetierLocal(/*allow_offloads=*/false);
  }
  // The previous snapshot is still out (a slow or stalled daemon): tiering waits, tokens don't.
  if (lane_->snapshot_in_flight()) return absl::OkStatus();
  ASSIGN_OR_RETURN(v1::SubmitSnapshotRequest snapshot, BuildSnapshot());
  submitted_generation_ = generation_;
  lane_->Submit(std::move(snapshot));
  return absl::OkStatus();
}

absl::Status TieredSequence::CollectPlan() {
  std::optional<absl::StatusOr<v1::TierPlan>> answer = lane_->TakePlan();
  if (!answer.has_value()) return absl::OkStatus();
  ScopedTimer timer(&report_.tier_nanos);
  // A plan of a session that is gone is void: its slots are in memory no longer ours.
  if (orphaned_ || submitted_generation_ != generation_) return absl::OkStatus();
  absl::Status s =
      answer->ok() ? ApplyDaemonPlan(**answer, /*background_ack=*/true) : answer->status();
  exchange_failed_ = !s.ok();
  if (s.ok()) return s;
  // The daemon did not answer in time, said no, or sent a plan we could not apply: no new
  // offloads until it answers again.
  if (client_->generation() != generation_) orphaned_ = true;
  ++report_.degraded_plans;
  return RetierLocal(/*allow_offloads=*/false);
}

void TieredSequence::Account() {
  const layout::KvGeometry& g = store_->geometry();
  const uint64_t length = store_->Length(0);
  tiering::SequenceState state{options_.prompt_tokens, length, options_.protected_prompt_begin};
  const tiering::Placement placement = store_->placement();
  absl::StatusOr<tiering::PlacementReport> r = tiering::Report(placement, state, g);
  if (!r.ok()) return;
  report_.length = length;
  for (int t = 0; t < tiering::kNumTiers; ++t) report_.tokens[t] = r->tokens[t];
  report_.evicted_generated_fraction = r->evicted_generated_fraction;
  report_.full_bytes = g.NumPages(length) * g.page_tokens * g.BytesPerToken();
  report_.t0_bytes = r->t0_bytes;
  report_.t0_peak_bytes = std::max(report_.t0_peak_bytes, r->t0_bytes);
  ++passes_;
  t0_sum_ += r->t0_bytes;
  full_sum_ += report_.full_bytes;
  report_.t0_mean_bytes = t0_sum_ / passes_;
  report_.full_mean_bytes = full_sum_ / passes_;
  report_.ddr_bytes = report_.compressed_bytes = 0;
  for (uint32_t grp = 0; grp < g.layer_groups; ++grp) {
    for (uint32_t page = 0; page < placement.num_pages; ++page) {
      const Tier tier = placement.at(grp, page);
      if (tier == Tier::kT1) report_.ddr_bytes += store_->SlotBytes(PoolKind::kDdr, grp);
      if (tier == Tier::kT2) {
        report_.compressed_bytes += store_->SlotBytes(PoolKind::kCompressed, grp);
      }
    }
  }
  const StoreStats& s = store_->stats();
  report_.split_attends = s.split_attends;
  auto moved = [&](Tier from, Tier to) {
    return s.move_bytes[static_cast<int>(from)][static_cast<int>(to)];
  };
  report_.offload_bytes = moved(Tier::kT0, Tier::kT1);
  report_.compress_bytes = moved(Tier::kT0, Tier::kT2) + moved(Tier::kT1, Tier::kT2);
  report_.promote_bytes = moved(Tier::kT1, Tier::kT0) + moved(Tier::kT2, Tier::kT0);
  report_.decompress_bytes = moved(Tier::kT2, Tier::kT1);
}

void TieredSequence::MeasureLostMass(absl::Span<const float> page_scores) {
  const uint64_t steps = step_ >= measured_step_ ? step_ - measured_step_ : 0;
  measured_step_ = step_;
  report_.lost_mass = lost_mass_meter_.Measure(page_scores, store_->placement(), store_->geometry(),
                                               store_->Length(0), steps);
  report_.lost_mass_peak = std::max(report_.lost_mass_peak, report_.lost_mass.total());
}

SequenceReport TieredSequence::Report() const { return report_; }

}  // namespace kvtier::worker
