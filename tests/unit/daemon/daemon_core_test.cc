#include "daemon/daemon_core.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <random>
#include <set>
#include <thread>

#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using testing::Env;
using testing::Policy;
using testing::RampScores;
using testing::SimWorker;
using testing::SmallOptions;

using testing::CountTier;
using testing::kT1Slot;

TEST(DaemonCoreTest, RegisterReturnsASessionAndPoolsOfItsOwnExtents) {
  Env env;
  SimWorker w(env.core.get());
  const auto& r = w.registration();
  EXPECT_NE(r.worker_id(), 0u);
  EXPECT_NE(r.daemon_epoch(), 0u);
  EXPECT_EQ(r.lease_ttl_ms(), 10000u);
  EXPECT_EQ(r.session_secret().size(), 16u);
  ASSERT_EQ(r.pools_size(), 2);
  for (const auto& d : r.pools()) {
    EXPECT_TRUE(d.shm_name().empty());  // nothing by name
    EXPECT_EQ(d.abi_version(), layout::kPoolAbiVersion);
    EXPECT_GT(d.extent_bytes(), 0u);
    EXPECT_EQ(d.size_bytes(), d.extent_bytes() * d.max_extents());
    v1::FetchExtents f = w.Signed(v1::FetchExtents());
    f.set_kind(d.kind());
    std::vector<edge::UniqueFd> fds;
    auto reply = env.core->FetchExtents(testing::SelfPeer(), f, &fds);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(fds.size(), 1u);  // the header; no extent before the first grant
    layout::PoolHeader h;
    ASSERT_EQ(pread(fds[0].get(), &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    EXPECT_TRUE(layout::ValidatePoolHeader(h,
                                           d.kind() == v1::POOL_KIND_DDR
                                               ? layout::PoolKind::kDdr
                                               : layout::PoolKind::kCompressed,
                                           d.extent_bytes(), d.max_extents(), w.id())
                    .ok());
    EXPECT_EQ(h.daemon_epoch, r.daemon_epoch());
  }
}

TEST(DaemonCoreTest, TwoSessionsNeverShareAnExtent) {
  Env env;
  SimWorker a(env.core.get()), b(env.core.get());
  for (SimWorker* w : {&a, &b}) {
    auto seq = w->Open(0, Policy("hierarchy", 0.1, 0, 0));
    ASSERT_TRUE(seq.ok());
    auto plan = w->Snapshot(*seq, 800, RampScores(50));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_GE(plan->ddr_extents(), 1u);
    ASSERT_TRUE(w->Ack(*plan, true).ok());
  }
  // Each worker gets descriptors of its own extents only; they are different files.
  std::vector<std::vector<edge::UniqueFd>> fds(2);
  int i = 0;
  for (SimWorker* w : {&a, &b}) {
    v1::FetchExtents f = w->Signed(v1::FetchExtents());
    f.set_kind(v1::POOL_KIND_DDR);
    auto reply = env.core->FetchExtents(testing::SelfPeer(), f, &fds[i]);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_GE(reply->extent_count(), 1u);
    ++i;
  }
  for (size_t x = 1; x < fds[0].size(); ++x) {
    for (size_t y = 1; y < fds[1].size(); ++y) {
      struct stat sa, sb;
      ASSERT_EQ(fstat(fds[0][x].get(), &sa), 0);
      ASSERT_EQ(fstat(fds[1][y].get(), &sb), 0);
      EXPECT_FALSE(sa.st_ino == sb.st_ino && sa.st_dev == sb.st_dev);
    }
  }
  // Another worker's secret, or another uid, gets nothing.
  v1::FetchExtents stolen = a.Signed(v1::FetchExtents());
  stolen.set_session_secret(b.secret());
  stolen.set_kind(v1::POOL_KIND_DDR);
  std::vector<edge::UniqueFd> none;
  EXPECT_EQ(env.core->FetchExtents(testing::SelfPeer(), stolen, &none).status().code(),
            absl::StatusCode::kPermissionDenied);
  edge::PeerCredentials other = testing::SelfPeer();
  other.uid += 1;
  EXPECT_EQ(env.core->FetchExtents(other, a.Signed(v1::FetchExtents()), &none).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(none.empty());
}

TEST(DaemonCoreTest, SnapshotOffloadsAndAckCommitsTwoPhase) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(64, Policy("hierarchy", 0.25, 0, 0));
  ASSERT_TRUE(seq.ok()) << seq.status();
  auto plan = w.Snapshot(*seq, 1024, RampScores(64));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->plan_version(), 1u);
  EXPECT_FALSE(plan->degraded());
  const int offloads = CountTier(plan->target_tiers(), 1);
  ASSERT_GT(offloads, 0);
  ASSERT_EQ(plan->move_group_size(), offloads);
  std::set<uint64_t> dst;
  for (int i = 0; i < plan->move_group_size(); ++i) {
    EXPECT_EQ(plan->move_from()[i], 0);
    EXPECT_EQ(plan->move_to()[i], 1);
    EXPECT_EQ(plan->move_src_slot(i), 0u);
    EXPECT_EQ(plan->move_dst_slot(i) % layout::kSlotAlignment, 0u);
    EXPECT_LE(plan->move_dst_slot(i) + kT1Slot, 8ull << 20);
    EXPECT_TRUE(dst.insert(plan->move_dst_slot(i)).second) << "slot granted twice";
  }
  // Destinations are held while the plan is in flight.
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), offloads * kT1Slot);
  // Report: T0 holds ceil(0.25 * 1024) tokens at most, nothing evicted.
  EXPECT_LE(plan->report().tokens_t0(), 256u);
  EXPECT_EQ(plan->report().tokens_t0() + plan->report().tokens_t1(), 1024u);
  EXPECT_EQ(plan->report().tokens_t3(), 0u);
  EXPECT_EQ(plan->report().full_bytes(), 1024u * 512);  // 512 bytes per token
  ASSERT_TRUE(w.Ack(*plan, true).ok());

  auto st = env.core->GetStatus([&] {
    v1::GetStatusRequest r = w.Signed(v1::GetStatusRequest());  // the worker's own view
    r.set_include_sequences(true);
    r.set_include_workers(true);
    return r;
  }());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->view(), "own");
  ASSERT_EQ(st->sequence_list_size(), 1);
  EXPECT_EQ(st->sequence_list(0).plan_version(), 1u);
  EXPECT_EQ(st->hbm_saved_bytes(), plan->report().full_bytes() - plan->report().t0_bytes());
  EXPECT_EQ(st->worker_list(0).ddr_bytes(), offloads * kT1Slot);

  // Next snapshot: pages moving out of T1 name their slot as source; acked sources are freed.
  std::vector<float> flipped = RampScores(64);
  for (float& f : flipped) f = 1000 - f;
  auto plan2 = w.Snapshot(*seq, 1100, flipped);
  ASSERT_TRUE(plan2.ok()) << plan2.status();
  EXPECT_EQ(plan2->plan_version(), 2u);
  int promotions = 0;
  for (int i = 0; i < plan2->move_group_size(); ++i) {
    if (plan2->move_from()[i] == 1) {
      EXPECT_TRUE(dst.count(plan2->move_src_slot(i))) << "source must be the granted slot";
      ++promotions;
    }
  }
  EXPECT_GT(promotions, 0);
  ASSERT_TRUE(w.Ack(*plan2, true).ok());
  const auto& view = w.seq(*seq);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(),
            CountTier(view.tiers, 1) * kT1Slot);
}

TEST(DaemonCoreTest, RefusedPlanFreesDestinationsAndKeepsPlacement) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan.ok());
  ASSERT_GT(plan->move_group_size(), 0);
  ASSERT_TRUE(w.Ack(*plan, false).ok());
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  // The worker still has everything in T0 and says so; the last acked version is accepted.
  auto again = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan_version(), 2u);
}

TEST(DaemonCoreTest, OnePlanInFlightPerSequence) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan.ok());
  auto blocked = w.Snapshot(*seq, 816, RampScores(51));
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(blocked.status().message().find("not acknowledged"), std::string::npos);
  // Acknowledging a version that is not in flight is refused, and changes nothing.
  v1::AckPlanRequest bad;
  bad.set_worker_id(w.id());
  bad.set_session_secret(w.secret());
  bad.set_sequence_id(*seq);
  bad.set_plan_version(plan->plan_version() + 1);
  bad.set_applied(true);
  EXPECT_EQ(env.core->AckPlan(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  // Acknowledging twice is a harmless replay (the first reply may have been lost).
  const uint64_t used = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();
  EXPECT_TRUE(w.Ack(*plan, true).ok());
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), used);
  // A snapshot claiming an older plan is stale.
  auto req = w.MakeSnapshot(*seq, 816, RampScores(51));
  req.set_last_plan_version(0);
  auto stale = env.core->SubmitSnapshot(req);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("last_plan_version"), std::string::npos);
}

TEST(DaemonCoreTest, SnapshotCarriesTheAckOfThePlanInFlight) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan1 = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan1.ok());
  ASSERT_GT(plan1->move_group_size(), 0);
  w.Apply(*plan1);

  // A wrong version is refused by name and settles nothing: the plan is still in flight.
  auto req = w.MakeSnapshot(*seq, 832, RampScores(52));
  req.set_applied_plan_version(plan1->plan_version() + 5);
  auto wrong = env.core->SubmitSnapshot(req);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("applied_plan_version"), std::string::npos);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());

  // The ack stands even when the snapshot it rides on is refused (here: a NaN score).
  req.set_applied_plan_version(plan1->plan_version());
  req.set_page_scores(3, std::nanf(""));
  EXPECT_EQ(env.core->SubmitSnapshot(req).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w.Ack(*plan1, true).ok());  // settled already: a replay changes nothing
  const uint64_t ddr_after_ack = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();
  EXPECT_EQ(ddr_after_ack, CountTier(w.seq(*seq).tiers, 1) * kT1Slot);

  // Carried on a valid snapshot, the next plan's ack needs no AckPlan call either.
  auto plan2 = w.Snapshot(*seq, 848, RampScores(53));
  ASSERT_TRUE(plan2.ok()) << plan2.status();
  w.Apply(*plan2);
  req = w.MakeSnapshot(*seq, 864, RampScores(54));
  req.set_applied_plan_version(plan2->plan_version());
  auto plan3 = env.core->SubmitSnapshot(req);
  ASSERT_TRUE(plan3.ok()) << plan3.status();
  ASSERT_TRUE(w.Ack(*plan3, true).ok());
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(),
            CountTier(w.seq(*seq).tiers, 1) * kT1Slot);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(DaemonCoreTest, CurrentTiersMustAgreeWithAcknowledgedPlacement) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  auto req = w.MakeSnapshot(*seq, 832, RampScores(52));
  // Claim an offloaded page is in T0.
  size_t i = req.current_tiers().find('\1');
  ASSERT_NE(i, std::string::npos);
  (*req.mutable_current_tiers())[i] = 0;
  auto r = env.core->SubmitSnapshot(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(absl::StrCat("current_tiers[", i, "]")), std::string::npos);
  // New tail pages must be T0.
  req = w.MakeSnapshot(*seq, 832, RampScores(52));
  (*req.mutable_current_tiers())[51] = 1;
  EXPECT_EQ(env.core->SubmitSnapshot(req).status().code(), absl::StatusCode::kFailedPrecondition);
  // The honest snapshot still works.
  EXPECT_TRUE(w.Snapshot(*seq, 832, RampScores(52)).ok());
}

TEST(DaemonCoreTest, CloseSequenceFreesEverythingIncludingPlanInFlight) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0.3));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  auto plan2 = w.Snapshot(*seq, 1700, RampScores(107, 9));
  ASSERT_TRUE(plan2.ok());  // left in flight
  uint64_t held = CountTier(w.seq(*seq).tiers, 1) + CountTier(w.seq(*seq).tiers, 2);
  uint64_t pending = 0;
  for (int i = 0; i < plan2->move_group_size(); ++i)
    pending +=
        plan2->move_dst_slot(i) != 0 || (plan2->move_to()[i] == 1 || plan2->move_to()[i] == 2);
  v1::CloseSequenceRequest c;
  c.set_worker_id(w.id());
  c.set_session_secret(w.secret());
  c.set_sequence_id(*seq);
  auto closed = env.core->CloseSequence(c);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->slots_freed(), held + pending);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_COMPRESSED).used_bytes(), 0u);
  EXPECT_EQ(env.core->CloseSequence(c).status().code(), absl::StatusCode::kNotFound);
}

TEST(DaemonCoreTest, LeaseExpiryReturnsAllSlotsAndWorkerMustRegisterAgain) {
  Env env;
  SimWorker a(env.core.get()), b(env.core.get());
  auto sa = a.Open(0, Policy("hierarchy", 0.1, 0, 0.2));
  auto sb = b.Open(0, Policy("hierarchy", 0.1, 0, 0.2));
  ASSERT_TRUE(sa.ok() && sb.ok());
  auto pa = a.Snapshot(*sa, 1600, RampScores(100));
  auto pb = b.Snapshot(*sb, 1600, RampScores(100));
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_TRUE(a.Ack(*pa, true).ok());
  ASSERT_TRUE(b.Ack(*pb, true).ok());
  const uint64_t both = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();
  ASSERT_GT(both, 0u);
  env.clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(b.Heartbeat().ok());
  EXPECT_EQ(env.core->ReapExpired(), 0);
  env.clock.Advance(absl::Seconds(6));
  EXPECT_EQ(env.core->ReapExpired(), 1);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), both / 2);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  EXPECT_EQ(a.Heartbeat().code(), absl::StatusCode::kFailedPrecondition);
  auto back = a.Snapshot(*sa, 1616, RampScores(101));
  EXPECT_EQ(back.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(back.status().message().find("register again"), std::string::npos);
  // b keeps working.
  EXPECT_TRUE(b.Snapshot(*sb, 1616, RampScores(101)).ok());
  env.clock.Advance(absl::Seconds(11));
  EXPECT_EQ(env.core->ReapExpired(), 1);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_COMPRESSED).used_bytes(), 0u);
  // A worker back after expiry registers again and gets a new id.
  SimWorker again(env.core.get());
  EXPECT_NE(again.id(), a.id());
}

TEST(DaemonCoreTest, ExpiredWorkerIsReapedOnItsNextRequest) {
  Env env;
  SimWorker a(env.core.get());
  auto sa = a.Open(0, Policy("hierarchy", 0.1, 0, 0));
  auto pa = a.Snapshot(*sa, 1600, RampScores(100));
  ASSERT_TRUE(pa.ok());
  env.clock.Advance(absl::Seconds(11));
  EXPECT_EQ(a.Ack(*pa, true).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  EXPECT_EQ(env.core->ReapExpired(), 0);
}

TEST(DaemonCoreTest, HeartbeatWithOtherEpochMustRegisterAgain) {
  Env env;
  SimWorker a(env.core.get());
  v1::HeartbeatRequest r;
  r.set_worker_id(a.id());
  r.set_session_secret(a.secret());
  r.set_daemon_epoch(a.registration().daemon_epoch() + 1);
  auto hb = env.core->Heartbeat(r);
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(hb.status().message().find("daemon_epoch"), std::string::npos);
  r.set_daemon_epoch(a.registration().daemon_epoch());
  r.set_worker_id(12345);
  EXPECT_EQ(env.core->Heartbeat(r).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a.Heartbeat().ok());
}

TEST(DaemonCoreTest, TinyDdrPoolDegradesAndKeepsPagesInT0) {
  Env env(SmallOptions(/*ddr=*/8 * kT1Slot, /*cmp=*/1 << 20));
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->degraded());
  EXPECT_NE(plan->degraded_reason().find("DDR pool full"), std::string::npos)
      << plan->degraded_reason();
  EXPECT_EQ(CountTier(plan->target_tiers(), 1), 8);
  EXPECT_EQ(CountTier(plan->target_tiers(), 2), 0);  // compress_ratio 0: not allowed to compress
  EXPECT_EQ(CountTier(plan->target_tiers(), 3), 0);  // never evict to make room
  EXPECT_EQ(plan->report().tokens_t3(), 0u);
  // The pages that got the 8 slots are the lowest-scoring of those the policy wanted in T1 (as a
  // roomy pool shows), so the ones kept in T0 are the best.
  Env roomy;
  SimWorker rw(roomy.core.get());
  auto rseq = rw.Open(0, Policy("hierarchy", 0.1, 0, 0));
  auto rplan = rw.Snapshot(*rseq, 1600, RampScores(100));
  ASSERT_TRUE(rplan.ok());
  std::vector<std::pair<float, int>> wanted;
  const auto scores = RampScores(100);
  for (int i = 0; i < 100; ++i) {
    if (rplan->target_tiers()[i] == 1) wanted.emplace_back(scores[i], i);
  }
  std::sort(wanted.begin(), wanted.end());
  ASSERT_GT(wanted.size(), 8u);
  for (size_t k = 0; k < wanted.size(); ++k) {
    EXPECT_EQ(plan->target_tiers()[wanted[k].second], k < 8 ? 1 : 0) << "rank " << k;
  }
  ASSERT_TRUE(w.Ack(*plan, true).ok());
}

TEST(DaemonCoreTest, TinyDdrPoolCompressesInsteadWhenPolicyAllows) {
  Env env(SmallOptions(/*ddr=*/8 * kT1Slot, /*cmp=*/4 << 20));
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0.1));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->degraded());
  EXPECT_EQ(CountTier(plan->target_tiers(), 1), 8);
  // Wanted: floor(0.1 * survivors) in T2; the rest of the T1 shortage went to T2 as well.
  EXPECT_GT(CountTier(plan->target_tiers(), 2), 10);
  EXPECT_EQ(CountTier(plan->target_tiers(), 3), 0);
  EXPECT_NE(plan->degraded_reason().find("compressed instead"), std::string::npos);
}

TEST(DaemonCoreTest, WorkerQuotaDegradesLikeAShortPool) {
  CoreOptions o = SmallOptions();
  o.worker_ddr_quota_bytes = 4 * kT1Slot;
  Env env(o);
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->degraded());
  EXPECT_NE(plan->degraded_reason().find("quota"), std::string::npos);
  EXPECT_EQ(CountTier(plan->target_tiers(), 1), 4);
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  // Raising the quota at run time lets the next plan offload more.
  o.worker_ddr_quota_bytes = 0;
  ASSERT_TRUE(env.core->Reload(o).ok());
  auto plan2 = w.Snapshot(*seq, 1616, RampScores(101));
  ASSERT_TRUE(plan2.ok());
  EXPECT_FALSE(plan2->degraded());
  EXPECT_GT(CountTier(plan2->target_tiers(), 1), 4);
}

// The evicted set under a tiny pool is exactly the one under a roomy pool: shortage changes
// where live pages sit, never how many are evicted.
TEST(DaemonCoreTest, NeverMoreEvictionThanConfiguredUnderPressure) {
  std::mt19937 rng(11);
  Env roomy(SmallOptions(64ull << 20, 32ull << 20));
  Env tiny(SmallOptions(6 * kT1Slot, 3 * 4096));
  SimWorker wr(roomy.core.get()), wt(tiny.core.get());
  auto pol = Policy("hierarchy", 0.2, 0.3, 0.2);
  auto sr = wr.Open(100, pol);
  auto st = wt.Open(100, pol);
  ASSERT_TRUE(sr.ok() && st.ok());
  uint64_t length = 100;
  for (int round = 0; round < 20; ++round) {
    length += 64 + rng() % 64;
    std::vector<float> scores(length / 16 + 1);
    for (float& s : scores) s = static_cast<float>(rng() % 500);
    auto pr = wr.Snapshot(*sr, length, scores);
    auto pt = wt.Snapshot(*st, length, scores);
    ASSERT_TRUE(pr.ok() && pt.ok()) << pr.status() << pt.status();
    for (size_t i = 0; i < pr->target_tiers().size(); ++i) {
      ASSERT_EQ(pr->target_tiers()[i] == 3, pt->target_tiers()[i] == 3) << "page " << i;
    }
    EXPECT_LE(pt->report().evicted_fraction_generated(), 0.3 + 1e-9);
    ASSERT_TRUE(wr.Ack(*pr, true).ok());
    ASSERT_TRUE(wt.Ack(*pt, true).ok());
  }
}

// Random workload over several workers and sequences, with refusals, closes and expiries: at
// every step no slot is held twice and the pools' used bytes equal what the workers hold.
TEST(DaemonCoreTest, NoSlotOwnedTwiceUnderRandomWorkload) {
  std::mt19937 rng(5);
  Env env(SmallOptions(200 * kT1Slot, 100 * 2560));
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(std::make_unique<SimWorker>(env.core.get()));
  std::map<uint64_t, v1::TierPlan> inflight;  // seq -> plan
  for (int step = 0; step < 1500; ++step) {
    SimWorker& w = *workers[rng() % workers.size()];
    int op = rng() % 10;
    auto& seqs = w.sequences();
    if (seqs.empty() || op == 0) {
      (void)w.Open(rng() % 200, Policy("hierarchy", (rng() % 50) / 100.0, (rng() % 30) / 100.0,
                                       (rng() % 30) / 100.0));
      continue;
    }
    auto it = std::next(seqs.begin(), rng() % seqs.size());
    const uint64_t id = it->first;
    if (inflight.count(id)) {
      ASSERT_TRUE(w.Ack(inflight[id], rng() % 4 != 0).ok());
      inflight.erase(id);
    } else if (op == 1) {
      v1::CloseSequenceRequest c;
      c.set_worker_id(w.id());
      c.set_session_secret(w.secret());
      c.set_sequence_id(id);
      ASSERT_TRUE(env.core->CloseSequence(c).ok());
      seqs.erase(it);
      continue;
    } else {
      uint64_t length = std::max<uint64_t>(it->second.length, it->second.prompt) + 1 + rng() % 300;
      auto plan = w.Snapshot(id, length, testing::RampScores(length / 16 + 1, rng()));
      ASSERT_TRUE(plan.ok()) << plan.status();
      inflight[id] = *plan;
    }
    // Invariant: slots held by workers (acknowledged) plus destinations in flight are distinct,
    // and the pool accounting equals their count.
    std::set<uint64_t> held[2];
    uint64_t n[2] = {0, 0};
    for (auto& wp : workers) {
      for (auto& [sid, s] : wp->sequences()) {
        for (size_t i = 0; i < s.tiers.size(); ++i) {
          int t = s.tiers[i];
          if (t == 1 || t == 2) {
            ASSERT_TRUE(held[t - 1].insert(s.slots[i]).second) << "slot owned twice";
            ++n[t - 1];
          }
        }
        if (inflight.count(sid)) {
          const auto& p = inflight[sid];
          for (int i = 0; i < p.move_group_size(); ++i) {
            int t = p.move_to()[i];
            if (t == 1 || t == 2) {
              ASSERT_TRUE(held[t - 1].insert(p.move_dst_slot(i)).second) << "dst owned twice";
              ++n[t - 1];
            }
          }
        }
      }
    }
    ASSERT_TRUE(testing::CoreInvariants(env.core.get()).ok())
        << testing::CoreInvariants(env.core.get());
    ASSERT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).slots_used(), n[0]);
    ASSERT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_COMPRESSED).slots_used(), n[1]);
  }
}

TEST(DaemonCoreTest, SequenceAndWorkerCapsAreResourceExhausted) {
  CoreOptions o = SmallOptions();
  o.max_sequences_per_worker = 2;
  o.max_workers = 2;
  Env env(o);
  SimWorker a(env.core.get()), b(env.core.get());
  EXPECT_TRUE(a.Open(0, Policy("full", 1, 0, 0)).ok());
  EXPECT_TRUE(a.Open(0, Policy("full", 1, 0, 0)).ok());
  EXPECT_EQ(a.Open(0, Policy("full", 1, 0, 0)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.Open(0, Policy("full", 1, 0, 0)).ok());
  EXPECT_EQ(testing::Register(env.core.get(), testing::WorkerRequest()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(DaemonCoreTest, AnotherWorkersSequenceIsPermissionDenied) {
  Env env;
  SimWorker a(env.core.get()), b(env.core.get());
  auto sa = a.Open(0, Policy("hierarchy", 0.5, 0, 0));
  ASSERT_TRUE(sa.ok());
  auto req = a.MakeSnapshot(*sa, 100, RampScores(7));
  req.set_worker_id(b.id());
  req.set_session_secret(b.secret());
  auto r = env.core->SubmitSnapshot(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("sequence_id"), std::string::npos);
  v1::CloseSequenceRequest c;
  c.set_worker_id(b.id());
  c.set_session_secret(b.secret());
  c.set_sequence_id(*sa);
  EXPECT_EQ(env.core->CloseSequence(c).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(DaemonCoreTest, LayerGroupsArePlacedIndependently) {
  Env env;
  SimWorker w(env.core.get(), /*groups=*/2);
  auto seq = w.Open(0, Policy("hierarchy", 0.3, 0.1, 0.1));
  ASSERT_TRUE(seq.ok());
  for (uint64_t len : {640, 900, 1300}) {
    auto plan = w.Snapshot(*seq, len, RampScores(100));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->target_tiers().size(), 2 * ((len + 15) / 16));
    ASSERT_TRUE(w.Ack(*plan, true).ok());
  }
}

TEST(DaemonCoreTest, FullPolicyKeepsEverythingInT0AndStreamingEvicts) {
  Env env;
  SimWorker w(env.core.get());
  auto full = w.Open(10, Policy("full", 0.1, 0, 0));
  auto streaming = w.Open(10, Policy("streaming", 1, 1, 0));
  ASSERT_TRUE(full.ok() && streaming.ok());
  auto pf = w.Snapshot(*full, 1000, RampScores(63));
  ASSERT_TRUE(pf.ok());
  EXPECT_EQ(pf->move_group_size(), 0);
  EXPECT_EQ(pf->report().tokens_t0(), 1000u);
  auto ps = w.Snapshot(*streaming, 1000, RampScores(63));
  ASSERT_TRUE(ps.ok());
  EXPECT_GT(ps->report().tokens_t3(), 0u);
  EXPECT_EQ(ps->report().tokens_t1() + ps->report().tokens_t2(), 0u);
}

TEST(DaemonCoreTest, SnapshotsCarryingLostMassFillTheGuardrailHistogram) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.5, 0.1, 0));
  auto quiet = w.Snapshot(*seq, 160, RampScores(10));  // a worker that does not measure it
  ASSERT_TRUE(quiet.ok());
  ASSERT_TRUE(w.Ack(*quiet, true).ok());
  v1::SubmitSnapshotRequest r = w.MakeSnapshot(*seq, 320, RampScores(20));
  r.mutable_lost_mass()->set_compressed(0.004);
  r.mutable_lost_mass()->set_evicted_estimate(0.03);
  ASSERT_TRUE(env.core->SubmitSnapshot(r).ok());
  prometheus::TextSerializer ser;
  std::string text = ser.Serialize(env.metrics->registry()->Collect());
  for (const char* part : {"compressed", "evicted", "total"}) {
    EXPECT_NE(
        text.find(absl::StrCat("kvtier_sequence_lost_mass_ratio_count{part=\"", part, "\"} 1")),
        std::string::npos)
        << text;
  }
  EXPECT_NE(text.find("kvtier_sequence_lost_mass_ratio_sum{part=\"total\"} 0.034"),
            std::string::npos)
      << text;
}

TEST(DaemonCoreTest, MetricsFollowTheFlow) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0.1, 0));
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  v1::OpenSequenceRequest bad;
  bad.set_worker_id(w.id());
  bad.set_session_secret(w.secret());
  (void)env.core->OpenSequence(bad);
  prometheus::TextSerializer ser;
  std::string text = ser.Serialize(env.metrics->registry()->Collect());
  EXPECT_NE(text.find("kvtier_snapshots_total 1"), std::string::npos);
  EXPECT_NE(text.find("kvtier_registry_workers 1"), std::string::npos);
  EXPECT_NE(text.find("kvtier_registry_sequences 1"), std::string::npos);
  EXPECT_NE(text.find("kvtier_rpc_errors_total{code=\"invalid_argument\",rpc=\"OpenSequence\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_plan_latency_seconds_count 1"), std::string::npos);
  EXPECT_EQ(text.find("kvtier_hbm_saved_bytes 0\n"), std::string::npos);
  EXPECT_EQ(text.find("kvtier_plan_evicted_tokens_total 0\n"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::daemon

namespace kvtier::daemon {
namespace {

// gRPC threads call the core concurrently: several workers running full rounds at once, with a
// reaper and status readers in parallel, leave the bookkeeping consistent.
TEST(DaemonCoreConcurrencyTest, ConcurrentWorkersKeepInvariants) {
  Env env(SmallOptions(40 * kT1Slot, 40 * 2560));
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < kThreads; ++i) workers.push_back(std::make_unique<SimWorker>(env.core.get()));
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SimWorker& w = *workers[t];
      for (int round = 0; round < 30; ++round) {
        auto seq = w.Open(32, Policy("hierarchy", 0.2, 0.1, 0.2));
        if (!seq.ok()) {
          ++failures;
          continue;
        }
        for (uint64_t len = 400; len < 1400; len += 200) {
          auto plan = w.Snapshot(*seq, len, RampScores(90, t * 100 + round));
          if (!plan.ok() || !w.Ack(*plan, (len / 200) % 3 != 0).ok()) ++failures;
        }
        v1::CloseSequenceRequest c;
        c.set_worker_id(w.id());
        c.set_session_secret(w.secret());
        c.set_sequence_id(*seq);
        if (!env.core->CloseSequence(c).ok()) ++failures;
        w.sequences().erase(*seq);
      }
    });
  }
  std::thread observer([&] {
    while (!stop.load()) {
      (void)env.core->ReapExpired();  // the clock does not move: nothing may be reaped
      v1::GetStatusRequest r;
      r.set_include_sequences(true);
      (void)env.core->GetStatus(r);
      if (!testing::CoreInvariants(env.core.get()).ok()) ++failures;
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  observer.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_COMPRESSED).used_bytes(), 0u);
}

}  // namespace
}  // namespace kvtier::daemon

namespace kvtier::daemon {
namespace {

// Workers running different models share the pools: each gets slots of its own page size.
TEST(DaemonCoreTest, WorkersWithDifferentPageSizesShareThePools) {
  Env env(SmallOptions(16ull << 20, 8ull << 20));
  SimWorker small(env.core.get());
  v1::RegisterWorkerRequest big_req = testing::WorkerRequest();
  big_req.mutable_geometry()->set_head_dim(48);  // 3x the page: 24576-byte T1 slots
  big_req.set_t1_page_bytes(3 * kT1Slot);
  big_req.set_t2_page_bytes(7000);
  auto big = testing::Register(env.core.get(), big_req);
  ASSERT_TRUE(big.ok()) << big.status();
  auto s1 = small.Open(0, Policy("hierarchy", 0.2, 0, 0.2));
  ASSERT_TRUE(s1.ok());
  v1::OpenSequenceRequest open;
  open.set_worker_id(big->worker_id());
  open.set_session_secret(big->session_secret());
  *open.mutable_policy() = Policy("hierarchy", 0.2, 0, 0.2);
  auto s2 = env.core->OpenSequence(open);
  ASSERT_TRUE(s2.ok());
  auto p1 = small.Snapshot(*s1, 1600, RampScores(100));
  ASSERT_TRUE(p1.ok());
  v1::SubmitSnapshotRequest r;
  r.set_worker_id(big->worker_id());
  r.set_session_secret(big->session_secret());
  r.set_sequence_id(s2->sequence_id());
  r.set_length(1600);
  r.set_num_pages(100);
  for (float f : RampScores(100, 3)) r.add_page_scores(f);
  r.set_current_tiers(std::string(100, '\0'));
  auto p2 = env.core->SubmitSnapshot(r);
  ASSERT_TRUE(p2.ok()) << p2.status();
  const uint64_t t1 =
      CountTier(p1->target_tiers(), 1) * kT1Slot + CountTier(p2->target_tiers(), 1) * 3 * kT1Slot;
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), t1);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  // Each worker's slots lie in its own extents (offsets address them) and never overlap.
  for (const auto& [plan, bytes] : {std::pair{&*p1, kT1Slot}, std::pair{&*p2, 3 * kT1Slot}}) {
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (int i = 0; i < plan->move_group_size(); ++i) {
      if (plan->move_to()[i] == 1) ranges.emplace_back(plan->move_dst_slot(i), bytes);
    }
    ASSERT_FALSE(ranges.empty());
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first);
    }
  }
}

}  // namespace
}  // namespace kvtier::daemon
