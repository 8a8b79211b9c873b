// Sessions and the trust boundary in the core: secrets, tickets, the peer rules, who sees what,
// and the parts of the plan protocol that let a session survive a lost message.

#include <unistd.h>

#include <functional>

#include "daemon/daemon_core.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using testing::Env;
using testing::Policy;
using testing::RampScores;
using testing::SimWorker;
using testing::SmallOptions;

// What an attacker could hope to change: the whole observable state of the core.
std::string Fingerprint(DaemonCore* core) {
  v1::GetStatusRequest r;
  r.set_include_workers(true);
  r.set_include_sequences(true);
  r.set_operator_ticket(testing::Ticket(core));  // this process runs as the daemon's uid
  auto st = core->GetStatus(r);
  EXPECT_TRUE(st.ok());
  // What the clock alone changes: lease and session ages, rates that decay.
  for (auto& w : *st->mutable_worker_list()) {
    w.clear_lease_remaining_ms();
    w.clear_lease_age_ms();
    w.clear_session_age_ms();
    w.clear_plans_per_second();
  }
  for (auto& s : *st->mutable_sequence_list()) s.clear_plans_per_second();
  st->clear_uptime_ms();
  return st->SerializeAsString();
}

TEST(SessionTest, EveryRequestWithAnotherWorkersIdsOrAWrongSecretIsDeniedAndChangesNothing) {
  Env env;
  SimWorker victim(env.core.get()), attacker(env.core.get());
  auto seq = victim.Open(0, Policy("hierarchy", 0.2, 0, 0.2));
  ASSERT_TRUE(seq.ok());
  auto plan = victim.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan.ok());  // left in flight: the attacker would love to settle it
  const std::string before = Fingerprint(env.core.get());
  env.clock.Advance(absl::Seconds(9));  // the victim's lease is nearly out

  const std::vector<std::string> secrets = {attacker.secret(), "", std::string(16, '\0'),
                                            victim.secret().substr(0, 15) + "x"};
  int denied = 0;
  for (const std::string& secret : secrets) {
    auto as = [&](auto r) {
      r.set_worker_id(victim.id());
      r.set_session_secret(secret);
      return r;
    };
    std::vector<std::function<absl::Status()>> calls = {
        [&] {
          v1::HeartbeatRequest r = as(v1::HeartbeatRequest());
          r.set_daemon_epoch(victim.registration().daemon_epoch());
          return env.core->Heartbeat(r).status();
        },
        [&] {
          v1::OpenSequenceRequest r = as(v1::OpenSequenceRequest());
          *r.mutable_policy() = Policy("hierarchy", 0.5, 0, 0);
          return env.core->OpenSequence(r).status();
        },
        [&] {
          v1::SubmitSnapshotRequest r = victim.MakeSnapshot(*seq, 816, RampScores(51));
          r = as(r);
          r.set_applied_plan_version(plan->plan_version());
          r.set_abandon_pending(true);
          return env.core->SubmitSnapshot(r).status();
        },
        [&] {
          v1::AckPlanRequest r = as(v1::AckPlanRequest());
          r.set_sequence_id(*seq);
          r.set_plan_version(plan->plan_version());
          r.set_applied(false);
          return env.core->AckPlan(r).status();
        },
        [&] {
          v1::CloseSequenceRequest r = as(v1::CloseSequenceRequest());
          r.set_sequence_id(*seq);
          return env.core->CloseSequence(r).status();
        },
        [&] { return env.core->CloseWorker(as(v1::CloseWorkerRequest())).status(); },
        [&] {
          v1::FetchExtents r = as(v1::FetchExtents());
          r.set_kind(v1::POOL_KIND_DDR);
          std::vector<edge::UniqueFd> fds;
          absl::Status s = env.core->FetchExtents(testing::SelfPeer(), r, &fds).status();
          EXPECT_TRUE(fds.empty());
          return s;
        },
        [&] {
          v1::HeartbeatRequest r = as(v1::HeartbeatRequest());
          r.set_daemon_epoch(victim.registration().daemon_epoch());
          return env.core->ChannelHeartbeat(testing::SelfPeer(), r).status();
        },
    };
    for (auto& call : calls) {
      absl::Status s = call();
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
      EXPECT_NE(s.message().find("session_secret"), absl::string_view::npos) << s;
      EXPECT_EQ(s.message().find(victim.secret()), absl::string_view::npos);
      denied += s.code() == absl::StatusCode::kPermissionDenied;
    }
  }
  EXPECT_EQ(denied, 8 * static_cast<int>(secrets.size()));
  EXPECT_EQ(Fingerprint(env.core.get()), before);
  // Not even the lease was renewed: two more seconds and the victim is gone.
  env.clock.Advance(absl::Seconds(2));
  EXPECT_EQ(env.core->ReapExpired(), 2);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(SessionTest, TicketsAreSingleUseShortLivedAndUnguessable) {
  Env env;
  v1::RegisterWorkerRequest r = testing::WorkerRequest();
  EXPECT_EQ(env.core->RegisterWorker(r).status().code(), absl::StatusCode::kPermissionDenied);
  r.set_channel_ticket(std::string(16, 'a'));
  auto guessed = env.core->RegisterWorker(r);
  EXPECT_EQ(guessed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(guessed.status().message().find("channel_ticket"), absl::string_view::npos);
  r.set_channel_ticket(testing::Ticket(env.core.get()));
  auto first = env.core->RegisterWorker(r);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(env.core->RegisterWorker(r).status().code(), absl::StatusCode::kPermissionDenied);
  r.set_channel_ticket(testing::Ticket(env.core.get()));
  env.clock.Advance(absl::Seconds(31));
  EXPECT_EQ(env.core->RegisterWorker(r).status().code(), absl::StatusCode::kPermissionDenied);
  // A registration refused for a bad field does not spend the ticket.
  r.set_channel_ticket(testing::Ticket(env.core.get()));
  v1::RegisterWorkerRequest bad = r;
  bad.set_t1_page_bytes(1);
  EXPECT_EQ(env.core->RegisterWorker(bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto second = env.core->RegisterWorker(r);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->session_secret(), second->session_secret());
}

TEST(SessionTest, OneUidCannotHoardTheTickets) {
  Env env;
  const edge::PeerCredentials greedy{1234, 0, 1, {}};
  int granted = 0;
  absl::Status last;
  for (int i = 0; i < 100; ++i) {
    auto t = env.core->Hello(greedy);
    granted += t.ok();
    if (!t.ok()) last = t.status();
  }
  EXPECT_EQ(granted, 64);
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(last.message().find("uid 1234"), absl::string_view::npos) << last;
  EXPECT_TRUE(env.core->Hello(testing::SelfPeer()).ok());  // others still get theirs
  env.clock.Advance(absl::Seconds(31));
  EXPECT_TRUE(env.core->Hello(greedy).ok());  // expired ones stop counting
}

TEST(SessionTest, PeersOutsideTheAllowedSetAreRefusedByNameOfTheRule) {
  CoreOptions o = SmallOptions();
  o.security.allow_uids = {4242};
  o.security.allow_gids = {777};
  Env env(o);
  edge::PeerCredentials stranger{1000, 1000, 99, {5, 6}};
  auto refused = env.core->Hello(stranger);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("uid 1000"), absl::string_view::npos);
  EXPECT_NE(refused.status().message().find("security.allow_uids [4242]"), absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("security.allow_gids [777]"), absl::string_view::npos);
  EXPECT_TRUE(env.core->Hello({4242, 1000, 99, {}}).ok());
  EXPECT_TRUE(env.core->Hello({1000, 1000, 99, {5, 777}}).ok());  // a supplementary group
  auto member = env.core->Hello({1000, 777, 99, {}});
  ASSERT_TRUE(member.ok());
  EXPECT_FALSE(member->operator_());
  EXPECT_EQ(member->peer_uid(), 1000u);
  // By default: root, the daemon's uid and the pool group.
  CoreOptions d = SmallOptions();
  d.security.pool_gid = 555;
  Env def(d);
  EXPECT_TRUE(def.core->Hello({0, 1, 1, {}}).ok());
  EXPECT_TRUE(def.core->Hello({1000, 555, 1, {}}).ok());
  auto no = def.core->Hello({getuid() == 1000 ? 1001u : 1000u, 1000, 1, {}});
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("pool group (gid 555"), absl::string_view::npos)
      << no.status();
}

TEST(SessionTest, StatusListsOnlyWhatTheCallerMaySee) {
  Env env;
  SimWorker a(env.core.get()), b(env.core.get());
  ASSERT_TRUE(a.Open(0, Policy("hierarchy", 0.5, 0, 0)).ok());
  ASSERT_TRUE(b.Open(0, Policy("hierarchy", 0.5, 0, 0)).ok());
  v1::GetStatusRequest r;
  r.set_include_workers(true);
  r.set_include_sequences(true);
  auto anyone = env.core->GetStatus(r);
  ASSERT_TRUE(anyone.ok());
  EXPECT_EQ(anyone->view(), "none");
  EXPECT_EQ(anyone->workers(), 2u);  // node totals for anyone
  EXPECT_EQ(anyone->worker_list_size(), 0);
  EXPECT_EQ(anyone->sequence_list_size(), 0);
  auto own = env.core->GetStatus(a.Signed(r));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->view(), "own");
  ASSERT_EQ(own->worker_list_size(), 1);
  EXPECT_EQ(own->worker_list(0).worker_id(), a.id());
  EXPECT_EQ(own->worker_list(0).uid(), getuid());  // the kernel's word
  EXPECT_EQ(own->worker_list(0).pid(), getpid());
  ASSERT_EQ(own->sequence_list_size(), 1);
  EXPECT_EQ(own->sequence_list(0).worker_id(), a.id());
  v1::GetStatusRequest forged = a.Signed(r);
  forged.set_worker_id(b.id());
  EXPECT_EQ(env.core->GetStatus(forged)->view(), "none");
  // Operators: a ticket for a uid in security.operator_uids (or the daemon's own).
  v1::GetStatusRequest op = r;
  op.set_operator_ticket(testing::Ticket(env.core.get()));
  auto all = env.core->GetStatus(op);
  EXPECT_EQ(all->view(), "all");
  EXPECT_EQ(all->worker_list_size(), 2);
  EXPECT_EQ(all->sequence_list_size(), 2);
  // The secret appears nowhere in any answer.
  for (const auto& st : {*anyone, *own, *all}) {
    EXPECT_EQ(st.SerializeAsString().find(a.secret()), std::string::npos);
  }
}

TEST(SessionTest, ASnapshotAbandonsThePlanALostReplyCarriedAndReplaysTheLastAck) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.2, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto first = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(w.Ack(*first, true).ok());
  // The next snapshot's reply is lost: the daemon holds a plan the worker never saw.
  auto lost = w.Snapshot(*seq, 1200, RampScores(75, 3));
  ASSERT_TRUE(lost.ok());
  const uint64_t with_lost = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();
  auto stuck = w.Snapshot(*seq, 1216, RampScores(76, 3));
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kFailedPrecondition);  // as before
  v1::SubmitSnapshotRequest retry = w.MakeSnapshot(*seq, 1216, RampScores(76, 3));
  retry.set_abandon_pending(true);
  retry.set_applied_plan_version(first->plan_version());  // an ack replayed, in doubt
  auto resumed = env.core->SubmitSnapshot(retry);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->plan_version(), lost->plan_version());
  ASSERT_TRUE(w.Ack(*resumed, true).ok());
  EXPECT_LE(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), with_lost);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

// A snapshot over the memory channel is the RPC's: the same plan (the same snapshot over gRPC
// replays it, as a client does when the plan is too large for the channel), from the uid that
// registered the worker only, and no call on the gRPC socket (like a channel heartbeat).
TEST(SessionTest, AChannelSnapshotIsTheRpcsFromTheWorkersUidOnly) {
  Env env;
  const pid_t self = getpid();
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.2, 0, 0));
  ASSERT_TRUE(seq.ok());
  env.clock.Advance(absl::Seconds(3));
  const v1::SubmitSnapshotRequest snap = w.MakeSnapshot(*seq, 800, RampScores(50));

  edge::PeerCredentials other = testing::SelfPeer();
  other.uid += 1;
  auto denied = env.core->ChannelSnapshot(other, snap);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("registered as uid"), absl::string_view::npos);
  const uint64_t ddr_before = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();

  auto reply = env.core->ChannelSnapshot(testing::SelfPeer(), snap);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->has_plan());
  EXPECT_GT(reply->plan().move_page_size(), 0);  // pages really leave T0
  EXPECT_GT(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), ddr_before)
      << "the refused snapshot granted nothing; this one did";
  EXPECT_EQ(env.core->SinceLastCall(self), absl::Seconds(3));  // not a call on the socket
  auto over_rpc = env.core->SubmitSnapshot(snap);
  ASSERT_TRUE(over_rpc.ok()) << over_rpc.status();
  EXPECT_EQ(over_rpc->SerializeAsString(), reply->plan().SerializeAsString());
  EXPECT_EQ(env.core->SinceLastCall(self), absl::ZeroDuration());
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

// Each message of a plan's round trip dropped in turn: nothing wedges, nothing is granted twice.
TEST(SessionTest, DroppingAnyMessageOfAPlanNeverWedgesTheSequence) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.2, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto ddr_used = [&] { return testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(); };

  // 1. The snapshot's reply is lost: the same snapshot again returns the same plan.
  const v1::SubmitSnapshotRequest snap = w.MakeSnapshot(*seq, 800, RampScores(50));
  auto lost = env.core->SubmitSnapshot(snap);
  ASSERT_TRUE(lost.ok());
  const uint64_t held = ddr_used();
  auto again = env.core->SubmitSnapshot(snap);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), lost->SerializeAsString());
  EXPECT_EQ(ddr_used(), held);  // granted once

  // 2. The ack's reply is lost: the replay succeeds and changes nothing.
  ASSERT_TRUE(w.Ack(*again, true).ok());
  const uint64_t committed = ddr_used();
  ASSERT_TRUE(w.Ack(*again, true).ok());
  EXPECT_EQ(ddr_used(), committed);

  // 3. The ack itself is lost: the next snapshot carries it.
  auto next = w.Snapshot(*seq, 1200, RampScores(75, 2));
  ASSERT_TRUE(next.ok());
  w.Apply(*next);  // applied, but the AckPlan never arrives
  v1::SubmitSnapshotRequest carried = w.MakeSnapshot(*seq, 1216, RampScores(76, 2));
  carried.set_applied_plan_version(next->plan_version());
  auto after = env.core->SubmitSnapshot(carried);
  ASSERT_TRUE(after.ok()) << after.status();

  // 4. The worker gives the plan in flight up (it never saw it): abandon_pending.
  v1::SubmitSnapshotRequest give_up = w.MakeSnapshot(*seq, 1232, RampScores(77, 2));
  give_up.set_abandon_pending(true);
  auto fresh = env.core->SubmitSnapshot(give_up);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_GT(fresh->plan_version(), after->plan_version());
  ASSERT_TRUE(w.Ack(*fresh, true).ok());
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(SessionTest, PagesTheWorkerEvictedWhileAwayAreAdoptedAndTheirSlotsFreed) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.2, 0.1, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 800, RampScores(50));
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(w.Ack(*plan, true).ok());
  const uint64_t evicted_before = plan->report().tokens_t3();
  const uint64_t used = testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes();
  // The worker evicts two of its T1 pages on its own (local policy, no daemon).
  testing::SimWorker::Seq& view = w.seq(*seq);
  int evicted = 0;
  for (size_t i = 0; i < view.tiers.size() && evicted < 2; ++i) {
    if (view.tiers[i] == 1) {
      view.tiers[i] = 3;
      ++evicted;
    }
  }
  ASSERT_EQ(evicted, 2);
  // Reported at a longer length, whose eviction budget has room for them.
  auto next = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GE(next->report().tokens_t3(), evicted_before + 2 * 16);
  for (size_t i = 0; i < view.tiers.size(); ++i) {
    if (view.tiers[i] == 3) {
      EXPECT_EQ(next->target_tiers()[i], 3) << "page " << i;
    }
  }
  ASSERT_TRUE(w.Ack(*next, true).ok());
  (void)used;
  // Pages come back from T3 never: a T3 page reported as T1 is refused.
  view = w.seq(*seq);
  for (char& t : view.tiers) {
    if (t == 3) {
      t = 1;
      break;
    }
  }
  EXPECT_EQ(w.Snapshot(*seq, 1616, RampScores(101)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(SessionTest, SpareExtentsAreMadeAheadAndHandedOutFirstWithinTheBudget) {
  Env env(SmallOptions(/*ddr=*/32ull << 20, /*cmp=*/4ull << 20));  // 2 MiB extents: 16 and 2
  env.core->PrepareSpareExtents();
  auto reserved = [&] {
    auto st = env.core->GetStatus(v1::GetStatusRequest());
    return st->pools(0).shm_name();
  };
  EXPECT_NE(reserved().find("(2 x 2 MiB"), std::string::npos) << reserved();
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));  // 90 pages of 8 KiB: one extent
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ddr_extents(), 1u);
  EXPECT_NE(reserved().find("(2 x 2 MiB"), std::string::npos) << "the grant took a spare";
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
  env.core->PrepareSpareExtents();  // tops up to two spares: 3 extents out
  EXPECT_NE(reserved().find("(3 x 2 MiB"), std::string::npos) << reserved();
  env.core->PrepareSpareExtents();  // never past the target
  EXPECT_NE(reserved().find("(3 x 2 MiB"), std::string::npos) << reserved();
  // The compressed budget (2 extents) is too small to keep spares.
  auto st = env.core->GetStatus(v1::GetStatusRequest());
  EXPECT_NE(st->pools(1).shm_name().find("(0 x"), std::string::npos) << st->pools(1).shm_name();
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(SessionTest, CloseWorkerReturnsItsExtentsAtOnce) {
  Env env;
  SimWorker w(env.core.get());
  auto seq = w.Open(0, Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 1600, RampScores(100));
  ASSERT_TRUE(plan.ok());
  ASSERT_GT(plan->ddr_extents(), 0u);
  auto closed = env.core->CloseWorker(w.Signed(v1::CloseWorkerRequest()));
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->sequences_closed(), 1u);
  EXPECT_EQ(testing::PoolOf(env.core.get(), v1::POOL_KIND_DDR).used_bytes(), 0u);
  auto st = env.core->GetStatus(v1::GetStatusRequest());
  EXPECT_EQ(st->workers(), 0u);
  EXPECT_NE(st->pools(0).shm_name().find("(0 x"), std::string::npos) << st->pools(0).shm_name();
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

TEST(SessionTest, ReloadRefusesALeaseShorterThanTheHeartbeatAndKeepsTheOld) {
  Env env;
  CoreOptions o = SmallOptions();
  o.lease_ttl = absl::Seconds(1);
  o.heartbeat_interval = absl::Seconds(2);
  absl::Status s = env.core->Reload(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("leases.ttl_ms"), absl::string_view::npos);
  SimWorker w(env.core.get());
  EXPECT_EQ(w.registration().lease_ttl_ms(), 10000u);
  o.lease_ttl = absl::Seconds(5);
  ASSERT_TRUE(env.core->Reload(o).ok());
  v1::HeartbeatRequest hb = w.Signed(v1::HeartbeatRequest());
  hb.set_daemon_epoch(w.registration().daemon_epoch());
  auto beat = env.core->Heartbeat(hb);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->lease_ttl_ms(), 5000u);  // every heartbeat says the TTL to respect
  EXPECT_EQ(beat->heartbeat_interval_ms(), 2000u);
}

TEST(SessionTest, LimitsBoundSlotSizesAndSequencesNodeWide) {
  CoreOptions o = SmallOptions();
  o.max_sequences = 3;
  Env env(o);
  v1::RegisterWorkerRequest r = testing::WorkerRequest();
  r.set_t1_page_bytes(3 * 8192);  // more than twice the geometry's page
  auto big = testing::Register(env.core.get(), r);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("t1_page_bytes"), absl::string_view::npos);
  r = testing::WorkerRequest();
  r.set_t2_page_bytes(2 * r.t1_page_bytes() + 1);
  EXPECT_NE(testing::Register(env.core.get(), r).status().message().find("t2_page_bytes"),
            absl::string_view::npos);
  SimWorker a(env.core.get()), b(env.core.get());
  ASSERT_TRUE(a.Open(0, Policy("hierarchy", 0.5, 0, 0)).ok());
  ASSERT_TRUE(a.Open(0, Policy("hierarchy", 0.5, 0, 0)).ok());
  ASSERT_TRUE(b.Open(0, Policy("hierarchy", 0.5, 0, 0)).ok());
  auto over = b.Open(0, Policy("hierarchy", 0.5, 0, 0));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("limits.max_sequences"), absl::string_view::npos);
}

// What the unread guard asks before dropping a connection: how long the sessions of a process
// have been quiet. Only authenticated calls count; a lease that ran out holds nothing.
TEST(SessionTest, SinceLastCallIsTheQuietTimeOfTheLiveSessionsOfAProcess) {
  Env env;
  const pid_t self = getpid();
  EXPECT_FALSE(env.core->SinceLastCall(self).has_value());  // no session yet
  SimWorker a(env.core.get()), b(env.core.get());           // both opened by this process
  env.clock.Advance(absl::Seconds(3));
  ASSERT_EQ(env.core->SinceLastCall(self), absl::Seconds(3));
  v1::HeartbeatRequest hb = a.Signed(v1::HeartbeatRequest());
  hb.set_daemon_epoch(a.registration().daemon_epoch());
  ASSERT_TRUE(env.core->Heartbeat(hb).ok());
  env.clock.Advance(absl::Seconds(1));
  EXPECT_EQ(env.core->SinceLastCall(self), absl::Seconds(1));  // the newest of the two
  // A call with a wrong secret is not the worker's.
  hb.set_session_secret(b.secret());
  EXPECT_FALSE(env.core->Heartbeat(hb).ok());
  env.clock.Advance(absl::Seconds(1));
  EXPECT_EQ(env.core->SinceLastCall(self), absl::Seconds(2));
  EXPECT_FALSE(env.core->SinceLastCall(self + 1).has_value());  // another process
  env.clock.Advance(absl::Seconds(9));                          // past a's lease (10 s) too
  EXPECT_FALSE(env.core->SinceLastCall(self).has_value());
}

// A heartbeat over the memory channel renews the lease like the RPC, but is no call on the gRPC
// socket: the unread guard must still see a worker that heartbeats there while it sends no RPC
// as quiet (paused), not as a client that keeps calling while it reads nothing.
TEST(SessionTest, AChannelHeartbeatRenewsTheLeaseButIsNoCallOnTheSocket) {
  Env env;  // lease 10 s
  const pid_t self = getpid();
  SimWorker a(env.core.get());
  v1::HeartbeatRequest hb = a.Signed(v1::HeartbeatRequest());
  hb.set_daemon_epoch(a.registration().daemon_epoch());
  env.clock.Advance(absl::Seconds(8));
  auto reply = env.core->ChannelHeartbeat(testing::SelfPeer(), hb);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->has_heartbeat());
  EXPECT_EQ(reply->heartbeat().lease_ttl_ms(), 10000u);
  EXPECT_EQ(env.core->SinceLastCall(self), absl::Seconds(8));  // not a call on the socket
  env.clock.Advance(absl::Seconds(8));  // 16 s since registering, 8 since the channel heartbeat
  EXPECT_EQ(env.core->ReapExpired(), 0);
  EXPECT_TRUE(env.core->Heartbeat(hb).ok());  // the lease lived on: the RPC renews it too
  EXPECT_EQ(env.core->SinceLastCall(self), absl::ZeroDuration());

  // The kernel's uid must be the one that registered the worker, whatever the message says.
  edge::PeerCredentials other = testing::SelfPeer();
  other.uid += 1;
  auto denied = env.core->ChannelHeartbeat(other, hb);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("registered as uid"), absl::string_view::npos);
  // A stale epoch is the restarted daemon's answer, as over gRPC.
  hb.set_daemon_epoch(hb.daemon_epoch() + 1);
  auto stale = env.core->ChannelHeartbeat(testing::SelfPeer(), hb);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("register again"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvtier::daemon
