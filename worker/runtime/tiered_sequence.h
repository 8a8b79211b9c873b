#ifndef KVTIER_WORKER_RUNTIME_TIERED_SEQUENCE_H_
#define KVTIER_WORKER_RUNTIME_TIERED_SEQUENCE_H_

// One sequence as an engine sees it: an AttentionCache that keeps cumulative scores from every
// forward pass and re-tiers itself every Δ decode steps (and at prefill end), with plans from
// kvtierd or from the same policy run locally. Public header of libkvtier_worker.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tiering/config.h"
#include "core/tiering/policy.h"
#include "core/tiering/scores.h"
#include "kvtier/v1/kvtier.pb.h"
#include "worker/attention_cache.h"
#include "worker/runtime/daemon_lane.h"
#include "worker/runtime/lost_mass_meter.h"
#include "worker/tiered_kv_store.h"

namespace kvtier {
class WorkerClient;
class PoolMapping;
}  // namespace kvtier

namespace kvtier::worker {

// What a sequence cost and where its tokens lived, cumulative over its life. Bytes are of this
// backend's KV precision (f32 on the CPU).
struct SequenceReport {
  uint64_t prompt_tokens = 0;
  uint64_t length = 0;
  uint64_t tokens[tiering::kNumTiers] = {};      // now, summed over layer groups
  double evicted_generated_fraction = 0;         // cumulative evicted share of generated tokens
  uint64_t full_bytes = 0;                       // what `full` would hold in T0 now
  uint64_t t0_bytes = 0, t0_peak_bytes = 0;      // now and peak over the sequence's steps
  double t0_mean_bytes = 0;                      // mean over forward passes
  double full_mean_bytes = 0;                    // mean of full_bytes over the same passes
  uint64_t ddr_bytes = 0, compressed_bytes = 0;  // held in T1 / T2 slots now
  // Bytes moved, by direction: T0→T1, →T2, →T0, T2→T1.
  uint64_t offload_bytes = 0, compress_bytes = 0, promote_bytes = 0, decompress_bytes = 0;
  uint64_t plans = 0, degraded_plans = 0, local_plans = 0;
  uint64_t protected_overflow_plans = 0;
  // Prefetch schedules (daemon mode, a declared link): followed and refused, and the bytes of
  // the one in force by class (what a GPU would keep staged, copy per step, read in place).
  uint64_t schedules = 0, schedules_refused = 0;
  uint64_t resident_bytes = 0, stage_bytes = 0, in_place_bytes = 0;
  uint64_t split_attends = 0;  // attention calls merged from two partials
  uint64_t tier_nanos = 0;     // deciding and executing plans (incl. daemon round trips)
  uint64_t attend_nanos = 0;   // attention over the tiers (incl. T2 staging)
  // The quality guardrail (core/tiering/lost_mass.h): attention mass per decode step that was
  // not served exactly over the interval before the last re-tiering — T2 mass weighted by the
  // codec's measured error, and the estimate for evicted pages — and the peak of their sum.
  tiering::LostMass lost_mass;
  double lost_mass_peak = 0;
};

struct SequenceOptions {
  std::string policy = "hierarchy";  // full | hierarchy | streaming (h2o/rkv/arkv: eval only)
  tiering::TieringConfig tiering;    // budgets, protected set, Δ (page_tokens: the worker's)
  uint64_t prompt_tokens = 0;
  // With tiering.protect_prompt: the first protected prompt position (0 = the whole prompt;
  // the start of the last user turn protects that turn only). Sent to kvtierd, which plans
  // with it too.
  uint64_t protected_prompt_begin = 0;
  std::string tag;  // shown by kvtierctl sequences
  // Daemon mode: wait for each plan at its re-tiering step (one round trip there) instead of
  // applying it at the first step boundary after it arrives. Plans then land at the same steps
  // as in local mode, so the same inputs give the same placement and, at r > 0, the same
  // tokens; the default keeps the daemon off the token path.
  bool wait_for_plans = false;
};

// Not thread-safe: one decode loop drives it. Created by WorkerRuntime.
class TieredSequence final : public AttentionCache {
 public:
  ~TieredSequence() override;

  uint32_t Length(uint32_t layer) const override { return store_->Length(layer); }
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override;
  // The same from strided K and V rows (TieredKvStore::Append's RowStrides overload).
  absl::Status Append(uint32_t layer, const float* k, RowStrides k_strides, const float* v,
                      RowStrides v_strides, uint32_t n);
  // Attends and accumulates scores; after the last layer of a forward pass the step ends, and
  // on a re-tiering step the sequence re-tiers before returning. On the CUDA backend (see
  // RuntimeOptions::backend) k, v, q and out are device memory, enqueued on the runtime's
  // stream, and position_mass must be null (INVALID_ARGUMENT): the store keeps the cumulative
  // score on the device and the sequence reads it once per re-tiering.
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override;
  // The same with the layer's sliding window and/or softcap, and strided queries
  // (TieredKvStore::Attend).
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out, float* position_mass,
                      const AttendMask& mask, RowStrides q_strides = {});
  // A forked prefill (the evaluation's FanOutCache): takes the per-position mass that another
  // sequence's Attend computed over the same K/V instead of attending, then accumulates scores
  // and ends the pass as Attend does (the caller has that sequence's output). Host scores only,
  // with every page in T0, where this store's kernel computes exactly that mass:
  // FAILED_PRECONDITION otherwise, and INVALID_ARGUMENT for a layer out of range.
  absl::Status AttendShared(uint32_t layer, uint32_t n, const float* position_mass);
  void SetTaskRunner(kernels::TaskRunner* runner) override { store_->SetTaskRunner(runner); }
  // Attend(layer, q_i, 1, out_i, nullptr) for each sequence's decode query, in one batch
  // (TieredKvStore::AttendBatch: one kernel on the CUDA backend); scores, the end of the
  // forward pass and re-tiering as each sequence's Attend does them. q and out are
  // [sequences.size()][q_heads][head_dim]. INVALID_ARGUMENT naming sequences[i] for a null or
  // repeated sequence, or what the store refuses; nothing is attended then.
  static absl::Status AttendBatch(const std::vector<TieredSequence*>& sequences, uint32_t layer,
                                  const float* q, float* out);

  // Re-tiers now, whatever the step (tests, and the end of a prefill done elsewhere).
  absl::Status Retier();
  // Rolls the sequence back to its first `length` positions (speculative decoding, a crop),
  // between forward passes; the scores of the positions kept stay. Pages past the end are
  // dropped whatever their tier and their slots freed; a kept partial page in T2 is promoted
  // first. In daemon mode a rollback below the length kvtierd last saw brings every offloaded
  // page back to T0 and re-opens the sequence there (kvtierd's lengths only grow): costly, and
  // rare for speculative decoding, which rolls back within the last Δ steps.
  // INVALID_ARGUMENT for a length past the end; FAILED_PRECONDITION (changing nothing) when the
  // page that keeps some rows was evicted (truncate to a multiple of page_tokens instead).
  absl::Status Truncate(uint32_t length);
  SequenceReport Report() const;
  const TieredKvStore& store() const { return *store_; }
  const tiering::ScoreAccumulator& scores() const { return scores_; }
  // The guardrail's per-page codec errors (Report().lost_mass has its figures).
  const LostMassMeter& lost_mass_meter() const { return lost_mass_meter_; }
  // False while the daemon that granted this sequence's slots is gone (restart, lease lost):
  // the sequence then plans locally, makes no new offloads and keeps what it holds, until it
  // re-opens under the client's new session (its pooled pages promoted back to T0 first, so
  // nothing is read from memory the old session held) and goes on tiering.
  bool daemon_backed() const { return client_ != nullptr && !orphaned_; }
  // Times the sequence re-opened under a new session.
  uint64_t rejoins() const { return rejoins_; }
  // Follows the prefetch schedule of plan `plan_version` (docs/scheduling.md): the pages it
  // leaves in place are attended by split attention until the next plan. FAILED_PRECONDITION
  // for a schedule of a plan other than the last one applied (stale); INVALID_ARGUMENT (see
  // CheckSchedule) for one that does not match the store. A refused schedule ends split
  // attention (every page attended whole) and is counted; nothing else changes.
  absl::Status FollowSchedule(uint64_t plan_version, const v1::PrefetchSchedule& schedule);

 private:
  friend class WorkerRuntime;
  TieredSequence(SequenceOptions options, std::unique_ptr<TieredKvStore> store,
                 tiering::ScoreAccumulator scores, std::unique_ptr<tiering::Policy> policy);

  absl::Status EndForwardPass(uint32_t n);
  // Host backend: this pass's position mass into the scores (prefill seeds them).
  absl::Status AddHostScores();
  // Device-score backends: the score gained on the device since the last re-tiering, added to
  // scores_ (once per re-tiering, never per step).
  absl::Status PullDeviceScores();
  absl::Status RetierLocal(bool allow_offloads);
  absl::Status RetierWithDaemon();
  absl::StatusOr<v1::SubmitSnapshotRequest> BuildSnapshot();
  // Executes a daemon plan and acknowledges it (in the background, or now).
  absl::Status ApplyDaemonPlan(const v1::TierPlan& plan, bool background_ack);
  // Daemon mode, off the token path: queue a snapshot / apply the plan that came back.
  absl::Status StartRetier();
  absl::Status CollectPlan();
  // Re-opens the sequence under the client's current session: promotes every T1/T2 page to T0,
  // moves the store to the new session's pools and opens a new daemon sequence. On failure the
  // sequence stays orphaned (and tries again at a later re-tiering).
  absl::Status Rejoin();
  // Promotes every T1/T2 page to T0 (exact copies); the slots given up are freed locally, and
  // in daemon mode left to CloseSequence.
  absl::Status PromoteAll();
  // Notices that the client's session changed (orphaned) and re-opens under the new one when it
  // can (Rejoin).
  void FollowSession();
  absl::StatusOr<tiering::Placement> LocalTarget(const std::vector<float>& page_scores,
                                                 bool allow_offloads);
  void Account();
  // The guardrail's figures for the interval since the last re-tiering (into report_).
  void MeasureLostMass(absl::Span<const float> page_scores);
  void ReleaseHeldSlots();
  // Tells the client the decode step time (a moving mean), for the daemon's schedules.
  void MeasureStep();

  SequenceOptions options_;
  std::unique_ptr<TieredKvStore> store_;
  tiering::ScoreAccumulator scores_;
  std::unique_ptr<tiering::Policy> policy_;
  std::vector<std::vector<float>> layer_mass_;  // [layer][position], this forward pass
  std::vector<float> step_attention_;           // layer_mass_ flattened, reused every pass
  uint64_t step_ = 0;                           // decode steps since prefill; 0 = prefill end
  bool prefilled_ = false;
  // Local mode: where slots come from (null in daemon mode).
  SlotSource* local_slots_ = nullptr;
  // Daemon mode.
  WorkerClient* client_ = nullptr;
  uint64_t sequence_id_ = 0;
  uint64_t daemon_length_ = 0;        // the length of the last snapshot kvtierd was sent
  v1::PolicyConfig wire_policy_;      // what OpenSequence sent, for a re-open
  std::unique_ptr<DaemonLane> lane_;  // the daemon calls of the decode loop, in the background
  uint64_t submitted_generation_ = 0;
  uint64_t rejoins_ = 0;
  uint64_t generation_ = 0;
  uint64_t acked_version_ = 0;
  uint64_t last_pass_nanos_ = 0;
  double step_seconds_ = 0;       // moving mean of decode steps
  bool exchange_failed_ = false;  // the last snapshot, plan or ack may not have arrived
  bool orphaned_ = false;
  std::shared_ptr<PoolMapping> ddr_mapping_, compressed_mapping_;  // keep old pools mapped
  std::unique_ptr<PagePool> ddr_pool_, compressed_pool_;
  // Report.
  SequenceReport report_;
  LostMassMeter lost_mass_meter_;
  uint64_t measured_step_ = 0;  // step_ at the last MeasureLostMass
  uint64_t passes_ = 0;
  double t0_sum_ = 0, full_sum_ = 0;
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_TIERED_SEQUENCE_H_
