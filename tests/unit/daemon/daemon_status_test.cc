// GetStatus's live figures: sizes learnt at open and from heartbeats (not only at re-tiering),
// plan counts and rates, lease ages, the host links and the snapshots' lost attention mass (what
// `kvtierctl top` and the status page show).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using testing::Env;
using testing::Policy;
using testing::RampScores;
using testing::SimWorker;
using testing::SmallOptions;

// WorkerRequest's geometry: 4 layers x 2 KV heads x 16 x f16, keys and values.
constexpr uint64_t kTokenBytes = 512;

v1::GetStatusResponse OperatorView(DaemonCore* core) {
  v1::GetStatusRequest r;
  r.set_include_workers(true);
  r.set_include_sequences(true);
  r.set_operator_ticket(testing::Ticket(core));  // this uid is the daemon's: an operator
  auto st = core->GetStatus(r);
  EXPECT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->view(), "all");
  return st.ok() ? *st : v1::GetStatusResponse();
}

const v1::SequenceStatus* Find(const v1::GetStatusResponse& st, uint64_t id) {
  for (const auto& s : st.sequence_list()) {
    if (s.sequence_id() == id) return &s;
  }
  ADD_FAILURE() << "sequence " << id << " not listed";
  return nullptr;
}

absl::Status Beat(DaemonCore* core, SimWorker& w,
                  std::vector<std::pair<uint64_t, uint64_t>> sizes) {
  v1::HeartbeatRequest r = w.Signed(v1::HeartbeatRequest());
  r.set_daemon_epoch(w.registration().daemon_epoch());
  for (auto [id, length] : sizes) {
    v1::SequenceSize* s = r.add_sequences();
    s->set_sequence_id(id);
    s->set_length(length);
  }
  return core->Heartbeat(r).status();
}

TEST(DaemonStatusTest, HeartbeatsShowASequencesSizeBeforeItsFirstPlan) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(32, Policy("hierarchy", 0.25, 0, 0));
  ASSERT_TRUE(seq.ok()) << seq.status();
  const v1::SequenceStatus* s = Find(OperatorView(env.core.get()), *seq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->length(), 0u);
  EXPECT_EQ(s->report().full_bytes(), 0u);

  ASSERT_TRUE(Beat(env.core.get(), w, {{*seq, 40}}).ok());
  const v1::GetStatusResponse st = OperatorView(env.core.get());
  s = Find(st, *seq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->length(), 40u);
  EXPECT_EQ(s->snapshot_length(), 0u);
  EXPECT_EQ(s->report().tokens_t0(), 40u);
  EXPECT_EQ(s->report().t0_bytes(), 40 * kTokenBytes);
  EXPECT_EQ(s->report().full_bytes(), 40 * kTokenBytes);
  EXPECT_EQ(st.hbm_saved_bytes(), 0u) << "new positions are in T0: nothing saved yet";
}

TEST(DaemonStatusTest, PositionsPastTheLastPlanAreShownInT0AndSavingsKept) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(64, Policy("hierarchy", 0.25, 0.1, 0));
  ASSERT_TRUE(seq.ok()) << seq.status();
  auto plan = w.Snapshot(*seq, 1024, RampScores(64));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  const v1::PlacementReport& planned = plan->report();
  ASSERT_GT(planned.tokens_t1(), 0u);
  ASSERT_GT(planned.evicted_fraction_generated(), 0.0);

  ASSERT_TRUE(Beat(env.core.get(), w, {{*seq, 1024 + 60}}).ok());
  const v1::GetStatusResponse st = OperatorView(env.core.get());
  const v1::SequenceStatus* s = Find(st, *seq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->length(), 1084u);
  EXPECT_EQ(s->snapshot_length(), 1024u);
  EXPECT_EQ(s->report().tokens_t0(), planned.tokens_t0() + 60);
  EXPECT_EQ(s->report().tokens_t1(), planned.tokens_t1());
  EXPECT_EQ(s->report().tokens_t3(), planned.tokens_t3());
  EXPECT_EQ(s->report().full_bytes(), planned.full_bytes() + 60 * kTokenBytes);
  EXPECT_EQ(st.hbm_saved_bytes(), planned.full_bytes() - planned.t0_bytes());
  // As many generated positions evicted, out of 60 more generated ones.
  EXPECT_NEAR(s->report().evicted_fraction_generated(),
              planned.evicted_fraction_generated() * (1024.0 - 64) / (1084.0 - 64), 1e-12);
  EXPECT_EQ(s->ddr_bytes(), testing::CountTier(w.seq(*seq).tiers, 1) * testing::kT1Slot);

  // A length below the snapshot's says nothing new; the next snapshot takes over.
  ASSERT_TRUE(Beat(env.core.get(), w, {{*seq, 500}}).ok());
  EXPECT_EQ(Find(OperatorView(env.core.get()), *seq)->length(), 1024u);
}

TEST(DaemonStatusTest, ASequenceReopenedWithItsLengthIsShownAtOnce) {
  Env env;
  SimWorker w(env.core.get());
  v1::OpenSequenceRequest r = w.Signed(v1::OpenSequenceRequest());
  r.set_prompt_tokens(32);
  *r.mutable_policy() = Policy("hierarchy", 0.5, 0, 0);
  r.set_length(300);
  auto open = env.core->OpenSequence(r);
  ASSERT_TRUE(open.ok()) << open.status();
  const v1::SequenceStatus* s = Find(OperatorView(env.core.get()), open->sequence_id());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->length(), 300u);
  EXPECT_EQ(s->report().tokens_t0(), 300u);

  r.set_length((1ull << 32) + 1);
  auto refused = env.core->OpenSequence(r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("length"), std::string::npos) << refused.status();
}

TEST(DaemonStatusTest, AHeartbeatCannotGrowAnotherWorkersSequence) {
  Env env;
  SimWorker victim(env.core.get());
  SimWorker other(env.core.get());
  auto seq = victim.Open(32, Policy("hierarchy", 0.5, 0, 0));
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(Beat(env.core.get(), victim, {{*seq, 50}}).ok());
  ASSERT_TRUE(Beat(env.core.get(), other, {{*seq, 100000}}).ok()) << "ignored, not an error";
  EXPECT_EQ(Find(OperatorView(env.core.get()), *seq)->length(), 50u);
}

TEST(DaemonStatusTest, BadSizesAreRefusedNamingTheFieldAndTheLeaseIsStillRenewed) {
  Env env;  // max_sequences_per_worker = 8
  SimWorker w(env.core.get());
  auto seq = w.Open(32, Policy("hierarchy", 0.5, 0, 0));
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(Beat(env.core.get(), w, {{*seq, 50}}).ok());
  std::vector<std::pair<uint64_t, uint64_t>> many;
  for (uint64_t i = 0; i < 9; ++i) many.push_back({*seq + i, 60});
  absl::Status st = Beat(env.core.get(), w, many);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequences"), std::string::npos) << st;
  EXPECT_NE(st.message().find("9"), std::string::npos) << st;
  st = Beat(env.core.get(), w, {{*seq, (1ull << 32) + 1}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequences[0].length"), std::string::npos) << st;
  EXPECT_EQ(Find(OperatorView(env.core.get()), *seq)->length(), 50u) << "nothing taken";
  // The refused heartbeats renewed the lease all the same.
  env.clock.Advance(absl::Seconds(6));
  ASSERT_FALSE(Beat(env.core.get(), w, many).ok());
  env.clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(w.Heartbeat().ok());
}

TEST(DaemonStatusTest, PlansAreCountedPerSequenceAndWorkerWithARecentRate) {
  Env env(SmallOptions(/*ddr=*/64ull << 10));  // 8 T1 slots: later plans are degraded
  SimWorker w(env.core.get());
  auto seq = w.Open(64, Policy("hierarchy", 0.25, 0, 0));
  ASSERT_TRUE(seq.ok());
  uint64_t degraded = 0;
  for (int i = 0; i < 5; ++i) {
    env.clock.Advance(absl::Seconds(1));
    auto plan = w.Snapshot(*seq, 1024 + 64 * i, RampScores(64));
    ASSERT_TRUE(plan.ok()) << plan.status();
    degraded += plan->degraded();
    ASSERT_TRUE(w.Ack(*plan, true).ok());
  }
  ASSERT_GT(degraded, 0u) << "the tiny pool must degrade some plan";
  v1::GetStatusResponse st = OperatorView(env.core.get());
  const v1::SequenceStatus* s = Find(st, *seq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->plans(), 5u);
  EXPECT_EQ(s->degraded_plans(), degraded);
  // Five plans a second apart: ~0.4/s after 5 s of a 10 s decay (a steady rate reads as itself).
  EXPECT_GT(s->plans_per_second(), 0.3);
  EXPECT_LT(s->plans_per_second(), 0.6);
  ASSERT_EQ(st.worker_list_size(), 1);
  EXPECT_EQ(st.worker_list(0).plans(), 5u);
  EXPECT_EQ(st.worker_list(0).degraded_plans(), degraded);
  EXPECT_DOUBLE_EQ(st.worker_list(0).plans_per_second(), s->plans_per_second());

  // Closing keeps the worker's counts; a minute without plans decays the rate to ~0.
  v1::CloseSequenceRequest close = w.Signed(v1::CloseSequenceRequest());
  close.set_sequence_id(*seq);
  ASSERT_TRUE(env.core->CloseSequence(close).ok());
  env.clock.Advance(absl::Seconds(60));  // the lease runs out too: status still lists it
  st = OperatorView(env.core.get());
  EXPECT_EQ(st.worker_list(0).plans(), 5u);
  EXPECT_LT(st.worker_list(0).plans_per_second(), 0.01);
}

TEST(DaemonStatusTest, LostMassIsTheLatestSnapshotsWithThePeakAndUnsetUntilOneCarriesIt) {
  Env env;
  SimWorker w(env.core.get());
  const v1::PolicyConfig policy = Policy("hierarchy", 0.25, 0.1, 0);
  auto seq = w.Open(64, policy);
  auto quiet = w.Open(64, policy);  // sends no lost mass
  ASSERT_TRUE(seq.ok() && quiet.ok());
  std::mt19937_64 rng(20261206);
  std::uniform_real_distribution<double> mass(0.0, 0.05);
  double compressed = 0, evicted = 0, peak = 0;
  uint64_t reports = 0;
  for (int i = 0; i < 8; ++i) {
    v1::SubmitSnapshotRequest r = w.MakeSnapshot(*seq, 1024 + 64 * i, RampScores(64));
    const bool carried = i == 0 || rng() % 3 != 0;  // some snapshots leave it unset
    if (carried) {
      compressed = mass(rng);
      evicted = mass(rng);
      peak = std::max(peak, compressed + evicted);
      ++reports;
      r.mutable_lost_mass()->set_compressed(compressed);
      r.mutable_lost_mass()->set_evicted_estimate(evicted);
    }
    auto plan = env.core->SubmitSnapshot(r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(w.Ack(*plan, true).ok());
    auto other = w.Snapshot(*quiet, 1024 + 64 * i, RampScores(64));
    ASSERT_TRUE(other.ok()) << other.status();
    ASSERT_TRUE(w.Ack(*other, true).ok());

    const v1::GetStatusResponse st = OperatorView(env.core.get());
    const v1::SequenceStatus* s = Find(st, *seq);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->has_lost_mass()) << "step " << i;
    EXPECT_EQ(s->lost_mass().compressed(), compressed) << "step " << i;
    EXPECT_EQ(s->lost_mass().evicted_estimate(), evicted) << "step " << i;
    EXPECT_EQ(s->lost_mass().total(), compressed + evicted) << "step " << i;
    EXPECT_EQ(s->lost_mass().peak_total(), peak) << "step " << i;
    EXPECT_EQ(s->lost_mass().reports(), reports) << "step " << i;
    const v1::SequenceStatus* q = Find(st, *quiet);
    ASSERT_NE(q, nullptr);
    EXPECT_FALSE(q->has_lost_mass()) << "it never sent any";
  }

  // A refused snapshot leaves the figures as they were.
  v1::SubmitSnapshotRequest bad = w.MakeSnapshot(*seq, 4096, RampScores(64));
  bad.mutable_lost_mass()->set_compressed(-0.5);
  EXPECT_FALSE(env.core->SubmitSnapshot(bad).ok());
  const v1::SequenceStatus* s = Find(OperatorView(env.core.get()), *seq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lost_mass().compressed(), compressed);
  EXPECT_EQ(s->lost_mass().reports(), reports);
}

TEST(DaemonStatusTest, LeaseAndSessionAgesFollowTheClock) {
  Env env;
  SimWorker w(env.core.get());
  env.clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(w.Heartbeat().ok());
  env.clock.Advance(absl::Milliseconds(1500));
  const v1::GetStatusResponse st = OperatorView(env.core.get());
  ASSERT_EQ(st.worker_list_size(), 1);
  EXPECT_EQ(st.worker_list(0).lease_age_ms(), 1500u);
  EXPECT_EQ(st.worker_list(0).session_age_ms(), 4500u);
  EXPECT_EQ(st.worker_list(0).lease_remaining_ms(), 10000u - 1500u);
}

TEST(DaemonStatusTest, LinksListTheirCapacityGrantsAndWorkers) {
  CoreOptions o = SmallOptions(32ull << 20, 8ull << 20);
  o.links = {LinkEntry{"sw0", 2e7, 1}};
  Env env(o);
  auto linked = [](const std::string& id) {
    v1::RegisterWorkerRequest r = testing::WorkerRequest(2);
    r.mutable_gpu()->set_total_bytes(1ull << 30);
    r.mutable_link()->set_link_id(id);
    r.mutable_link()->set_link_bytes_per_second(1e9);
    return r;
  };
  SimWorker a(env.core.get(), linked("sw0"));
  SimWorker b(env.core.get(), linked("sw0"));
  SimWorker c(env.core.get(), linked("mine"));
  for (SimWorker* w : {&a, &b}) {
    auto seq = w->Open(32, Policy("hierarchy", 0.3, 0, 0));
    ASSERT_TRUE(seq.ok());
    auto plan = w->Snapshot(*seq, 1024, RampScores(64));
    ASSERT_TRUE(plan.ok()) << plan.status();
  }
  const v1::GetStatusResponse st = OperatorView(env.core.get());
  ASSERT_EQ(st.links_size(), 2);
  const v1::LinkStatus& mine = st.links(0).link_id() == "mine" ? st.links(0) : st.links(1);
  const v1::LinkStatus& sw0 = st.links(0).link_id() == "sw0" ? st.links(0) : st.links(1);
  EXPECT_EQ(sw0.scope(), "operator");
  EXPECT_EQ(sw0.workers(), 2u);
  EXPECT_DOUBLE_EQ(sw0.bytes_per_second(), 2e7) << "the table's figure, not the declared 1e9";
  EXPECT_EQ(sw0.numa_node(), 1u);
  EXPECT_GT(sw0.granted_bytes_per_second(), 0);
  EXPECT_LE(sw0.granted_bytes_per_second(), 2e7 * (1 + 1e-9));
  EXPECT_EQ(mine.scope(), absl::StrCat("uid ", getuid()));
  EXPECT_EQ(mine.workers(), 1u);
  EXPECT_EQ(mine.granted_bytes_per_second(), 0) << "no plan yet";

  // A worker's own view lists its own link only.
  v1::GetStatusRequest own = c.Signed(v1::GetStatusRequest());
  own.set_include_workers(true);
  auto mine_only = env.core->GetStatus(own);
  ASSERT_TRUE(mine_only.ok());
  ASSERT_EQ(mine_only->links_size(), 1);
  EXPECT_EQ(mine_only->links(0).link_id(), "mine");
}

TEST(DaemonStatusTest, OperatorStatusListsEverythingWithoutATicket) {
  Env env;
  SimWorker w(env.core.get());
  ASSERT_TRUE(w.Open(32, Policy("hierarchy", 0.5, 0, 0)).ok());
  const v1::GetStatusResponse st = env.core->OperatorStatus();
  EXPECT_EQ(st.view(), "all");
  EXPECT_EQ(st.worker_list_size(), 1);
  EXPECT_EQ(st.sequence_list_size(), 1);
  EXPECT_EQ(st.pools_size(), 2);
}

}  // namespace
}  // namespace kvtier::daemon
