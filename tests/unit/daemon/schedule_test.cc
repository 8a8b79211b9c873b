// Prefetch schedules from the daemon (issue #17, docs/scheduling.md): what a worker may declare
// of its link, how a link is shared between the workers behind it, and the schedule each plan
// carries — every T1/T2 page of the target in exactly one list, within the budgets, never a
// tier changed.

#include "core/tiering/schedule.h"

#include <cmath>
#include <limits>
#include <random>

#include "daemon/link_schedule.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using testing::CoreInvariants;
using testing::Env;
using testing::SimWorker;
using testing::SmallOptions;
using testing::WorkerRequest;

v1::RegisterWorkerRequest LinkedRequest(const std::string& link_id, double bytes_per_second,
                                        uint64_t staging_bytes, uint32_t groups = 2,
                                        uint32_t numa = 0) {
  v1::RegisterWorkerRequest r = WorkerRequest(groups);
  r.mutable_gpu()->set_total_bytes(1ull << 30);
  v1::HostLink* l = r.mutable_link();
  l->set_link_id(link_id);
  l->set_link_bytes_per_second(bytes_per_second);
  l->set_staging_bytes(staging_bytes);
  l->set_numa_node(numa);
  return r;
}

// Every T1/T2 page of `target` is in exactly one list of its group, nothing else is, and the
// classes fit their budgets (page_bytes: the registration's T1 and T2 slot sizes).
void ExpectCovers(const v1::PrefetchSchedule& s, const std::string& target, uint32_t groups,
                  uint64_t t1_bytes, uint64_t t2_bytes) {
  ASSERT_EQ(s.groups_size(), static_cast<int>(groups));
  const uint32_t pages = static_cast<uint32_t>(target.size() / groups);
  std::vector<int> seen(target.size(), 0);
  uint64_t resident = 0, staged = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    const v1::GroupSchedule& gs = s.groups(static_cast<int>(g));
    auto take = [&](const google::protobuf::RepeatedField<uint32_t>& list, uint64_t* bytes) {
      for (uint32_t p : list) {
        ASSERT_LT(p, pages);
        const size_t i = size_t{g} * pages + p;
        const int t = target[i];
        ASSERT_TRUE(t == 1 || t == 2) << "group " << g << " page " << p << " is T" << t;
        ++seen[i];
        if (bytes != nullptr) *bytes += t == 1 ? t1_bytes : t2_bytes;
      }
    };
    take(gs.resident(), &resident);
    take(gs.stage(), &staged);
    take(gs.in_place(), nullptr);
  }
  uint64_t pooled = 0;
  for (size_t i = 0; i < target.size(); ++i) {
    EXPECT_EQ(seen[i], target[i] == 1 || target[i] == 2 ? 1 : 0) << "entry " << i;
    pooled += target[i] == 1 || target[i] == 2;
  }
  // The bound the daemon's message-size check counts on.
  EXPECT_LE(s.ByteSizeLong(), ScheduleBytesBound(groups, pooled));
  EXPECT_LE(resident, s.staging_bytes());
  EXPECT_LE(staged, s.h2d_bytes_per_step());
}

TEST(LinkDeclarationTest, ImpossibleLinksAreRefusedNamingTheFieldAndValue) {
  struct Case {
    const char* field;
    std::function<void(v1::RegisterWorkerRequest&)> spoil;
  };
  const Case cases[] = {
      {"link.link_bytes_per_second",
       [](auto& r) { r.mutable_link()->set_link_bytes_per_second(-1); }},
      {"link.link_bytes_per_second",
       [](auto& r) { r.mutable_link()->set_link_bytes_per_second(std::nan("")); }},
      {"link.link_bytes_per_second",
       [](auto& r) { r.mutable_link()->set_link_bytes_per_second(5e12); }},
      {"link.link_bytes_per_second",
       [](auto& r) {
         r.mutable_link()->set_link_bytes_per_second(std::numeric_limits<double>::infinity());
       }},
      {"link.numa_node", [](auto& r) { r.mutable_link()->set_numa_node(1024); }},
      {"link.staging_bytes", [](auto& r) { r.mutable_link()->set_staging_bytes(2ull << 30); }},
      {"link.link_id", [](auto& r) { r.mutable_link()->set_link_id("pcie switch"); }},
      {"link.link_id", [](auto& r) { r.mutable_link()->set_link_id(std::string(129, 'a')); }},
  };
  Env env;
  for (const Case& c : cases) {
    v1::RegisterWorkerRequest r = LinkedRequest("sw0", 50e9, 1 << 20);
    c.spoil(r);
    absl::StatusOr<v1::RegisterWorkerResponse> got = testing::Register(env.core.get(), r);
    ASSERT_FALSE(got.ok()) << c.field;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(c.field), std::string::npos) << got.status();
  }
  auto status = env.core->GetStatus(v1::GetStatusRequest());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->workers(), 0u) << "a refused registration registers nobody";
}

TEST(LinkDeclarationTest, OneLinkIdOnTwoNumaNodesIsRefusedAndTheFirstWorkerKeepsServing) {
  Env env;
  SimWorker first(env.core.get(), LinkedRequest("sw0", 50e9, 1 << 20, 2, /*numa=*/0));
  absl::StatusOr<v1::RegisterWorkerResponse> second =
      testing::Register(env.core.get(), LinkedRequest("sw0", 50e9, 1 << 20, 2, /*numa=*/1));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("link.numa_node 1 differs from NUMA node 0"),
            std::string::npos)
      << second.status();
  EXPECT_EQ(second.status().message().find("worker "), std::string::npos)
      << "names another worker: " << second.status();
  EXPECT_TRUE(first.Heartbeat().ok());
  // Another link on node 1 is fine.
  EXPECT_TRUE(testing::Register(env.core.get(), LinkedRequest("sw1", 50e9, 1 << 20, 2, 1)).ok());
}

TEST(LinkDeclarationTest, HeartbeatStepTimeIsCheckedAndShown) {
  Env env;
  SimWorker w(env.core.get(), LinkedRequest("sw0", 50e9, 1 << 20));
  for (double bad : {-0.5, std::nan(""), 601.0, std::numeric_limits<double>::infinity()}) {
    v1::HeartbeatRequest r = w.Signed(v1::HeartbeatRequest());
    r.set_daemon_epoch(w.registration().daemon_epoch());
    r.set_step_seconds(bad);
    absl::Status s = env.core->Heartbeat(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("step_seconds"), std::string::npos) << s;
  }
  v1::HeartbeatRequest r = w.Signed(v1::HeartbeatRequest());
  r.set_daemon_epoch(w.registration().daemon_epoch());
  r.set_step_seconds(0.031);
  ASSERT_TRUE(env.core->Heartbeat(r).ok());
  v1::GetStatusRequest q = w.Signed(v1::GetStatusRequest());
  q.set_include_workers(true);
  auto status = env.core->GetStatus(q);
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->worker_list_size(), 1);
  EXPECT_DOUBLE_EQ(status->worker_list(0).step_seconds(), 0.031);
  EXPECT_EQ(status->worker_list(0).link_id(), "sw0");
}

TEST(LinkShareTest, GrantsOnALinkNeverExceedItAndNoMemberGetsMoreThanItNeeds) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> bw(1e9, 64e9), step(0.001, 0.2);
  std::uniform_int_distribution<uint64_t> bytes(0, 4ull << 30);
  for (int round = 0; round < 500; ++round) {
    std::vector<LinkMember> members(1 + rng() % 8);
    double capacity = std::numeric_limits<double>::infinity();
    for (LinkMember& m : members) {
      m = {bw(rng), bytes(rng), bytes(rng) / 4, step(rng)};
      capacity = std::min(capacity, m.link_bytes_per_second);
    }
    double total = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      const double g = LinkGrant(members, i);
      const LinkMember& m = members[i];
      const double need =
          static_cast<double>(m.pooled_bytes - std::min(m.pooled_bytes, m.staging_bytes)) /
          m.step_seconds;
      EXPECT_GE(g, 0);
      EXPECT_LE(g, need * (1 + 1e-12));
      total += g;
    }
    EXPECT_LE(total, capacity * (1 + 1e-9)) << "round " << round;
  }
}

// Grants in force change only at each member's own plan: a newcomer gets what the others
// leave, and the shares settle at the fair ones after every member planned again.
TEST(LinkShareTest, GrantsInForceNeverAddUpToMoreThanTheLinkAsMembersReplan) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint64_t> bytes(0, 1ull << 30);
  for (int round = 0; round < 200; ++round) {
    std::vector<LinkMember> members(2 + rng() % 6);
    for (LinkMember& m : members) m = {10e9, bytes(rng), 0, 0.02, 0};
    for (int pass = 0; pass < 3; ++pass) {
      for (size_t i = 0; i < members.size(); ++i) {
        members[i].granted = LinkGrant(members, i);
        double total = 0;
        for (const LinkMember& m : members) total += m.granted;
        ASSERT_LE(total, 10e9 * (1 + 1e-9)) << "round " << round << " pass " << pass;
      }
    }
    // Settled: each member's grant is its max-min fair share.
    for (size_t i = 0; i < members.size(); ++i) {
      std::vector<LinkMember> fresh = members;
      for (LinkMember& m : fresh) m.granted = 0;
      std::vector<tiering::LinkDemand> d;
      for (const LinkMember& m : fresh) d.push_back({0, m.pooled_bytes / m.step_seconds});
      const double fair = (*tiering::ShareLinks({10e9}, d))[i];
      EXPECT_NEAR(members[i].granted, fair, fair * 1e-9 + 1) << "round " << round;
    }
  }
}

TEST(LinkShareTest, ASequenceGetsItsShareOfTheWorkersGrantAndStaging) {
  const SequenceBudget b = ShareOfWorker(10e9, 0.02, 1 << 20, 300, 1200);
  EXPECT_EQ(b.h2d_bytes_per_step, static_cast<uint64_t>(10e9 * 0.02 / 4));
  EXPECT_EQ(b.staging_bytes, (1u << 20) / 4);
  EXPECT_EQ(ShareOfWorker(10e9, 0.02, 1 << 20, 0, 0).h2d_bytes_per_step, 0u);
}

// Plans of sequences driven through the core, with a link declared: the schedule covers the
// target exactly, fits its budgets, and grows tight as the link is shared.
TEST(DaemonScheduleTest, EveryPlanCarriesAScheduleThatCoversItsTargetWithinBudget) {
  Env env(SmallOptions(32ull << 20, 8ull << 20));
  const v1::RegisterWorkerRequest req = LinkedRequest("sw0", 2e7, 64 * 1024, 2);
  SimWorker a(env.core.get(), req), b(env.core.get(), req);
  const uint64_t t1 = req.t1_page_bytes(), t2 = req.t2_page_bytes();
  std::mt19937 rng(5);
  for (SimWorker* w : {&a, &b}) {
    for (int k = 0; k < 2; ++k) {
      auto seq = w->Open(32, testing::Policy("hierarchy", 0.3, 0.0, 0.3));
      ASSERT_TRUE(seq.ok()) << seq.status();
      for (uint64_t length = 256; length <= 1024; length += 256) {
        std::vector<float> scores(length / 16);
        for (float& s : scores) s = static_cast<float>(rng() % 1000);
        auto plan = w->Snapshot(*seq, length, scores);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_TRUE(plan->has_schedule());
        ExpectCovers(plan->schedule(), plan->target_tiers(), 2, t1, t2);
        // `a` plans first and takes what it needs; `b` gets what `a` leaves (see below).
        if (w == &a) {
          EXPECT_GT(plan->schedule().h2d_bytes_per_second(), 0);
        }
        EXPECT_LE(plan->schedule().h2d_bytes_per_second(), 2e7);
        EXPECT_DOUBLE_EQ(plan->schedule().step_seconds(), 0.02) << "the assumed step";
        ASSERT_TRUE(w->Ack(*plan, true).ok());
        ASSERT_TRUE(CoreInvariants(env.core.get()).ok()) << CoreInvariants(env.core.get());
      }
    }
  }
  // Two sequences of 1024 tokens at β 0.3 hold ~1.4 MB of T1/T2 a worker: restaging it every
  // 20 ms step would take ~70 MB/s, the link carries 20. `a` planned first and took the whole
  // link, `b` got what `a` left; one more round each and they share it evenly. With 64 KiB of
  // staging most pages are then attended in place.
  for (int round = 0; round < 2; ++round) {
    for (SimWorker* w : {&a, &b}) {
      for (auto& [id, seq] : w->sequences()) {
        auto plan = w->Snapshot(id, seq.length, std::vector<float>(seq.num_pages, 1.f));
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_TRUE(w->Ack(*plan, true).ok());
      }
    }
  }
  v1::GetStatusRequest q = a.Signed(v1::GetStatusRequest());
  q.set_include_workers(true);
  auto mine = env.core->GetStatus(q);
  ASSERT_TRUE(mine.ok());
  const double grant_a = mine->worker_list(0).h2d_grant_bytes_per_second();
  q = b.Signed(v1::GetStatusRequest());
  q.set_include_workers(true);
  auto theirs = env.core->GetStatus(q);
  ASSERT_TRUE(theirs.ok());
  const double grant_b = theirs->worker_list(0).h2d_grant_bytes_per_second();
  EXPECT_LE(grant_a + grant_b, 2e7 * (1 + 1e-9));
  EXPECT_NEAR(grant_a, 1e7, 1e7 * 1e-6);
  EXPECT_NEAR(grant_b, 1e7, 1e7 * 1e-6);
  const uint64_t first = a.sequences().begin()->first;
  auto plan = a.Snapshot(first, 1040, std::vector<float>(65, 1.f));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int in_place = 0;
  for (const auto& g : plan->schedule().groups()) in_place += g.in_place_size();
  EXPECT_GT(in_place, 0);
}

TEST(DaemonScheduleTest, AWorkerWithoutALinkGetsNoSchedule) {
  Env env;
  SimWorker w(env.core.get(), 2);
  auto seq = w.Open(32, testing::Policy("hierarchy", 0.3, 0.0, 0.0));
  ASSERT_TRUE(seq.ok());
  auto plan = w.Snapshot(*seq, 512, testing::RampScores(32));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->target_tiers().find('\x01'), std::string::npos) << "pages left T0";
  EXPECT_FALSE(plan->has_schedule());
}

// A schedule changes no tier: the same snapshots with and without a link give the same plans.
TEST(DaemonScheduleTest, ALinkChangesNoTierAndNoEviction) {
  Env with(SmallOptions(32ull << 20, 8ull << 20)), without(SmallOptions(32ull << 20, 8ull << 20));
  SimWorker a(with.core.get(), LinkedRequest("", 1e9, 1 << 16, 2));
  SimWorker b(without.core.get(), 2);
  const v1::PolicyConfig policy = testing::Policy("hierarchy", 0.4, 0.1, 0.2);
  auto sa = a.Open(32, policy), sb = b.Open(32, policy);
  ASSERT_TRUE(sa.ok() && sb.ok());
  for (uint64_t length = 128; length <= 2048; length += 128) {
    const std::vector<float> scores = testing::RampScores(length / 16, length);
    auto pa = a.Snapshot(*sa, length, scores);
    auto pb = b.Snapshot(*sb, length, scores);
    ASSERT_TRUE(pa.ok() && pb.ok());
    EXPECT_EQ(pa->target_tiers(), pb->target_tiers()) << length;
    EXPECT_EQ(pa->move_to(), pb->move_to()) << length;
    ASSERT_TRUE(a.Ack(*pa, true).ok());
    ASSERT_TRUE(b.Ack(*pb, true).ok());
  }
}

// The grant of `w`'s first plan on a fresh sequence of 1024 tokens (candidates in T1).
double FirstGrant(SimWorker& w) {
  auto seq = w.Open(32, testing::Policy("hierarchy", 0.3, 0.0, 0.0));
  EXPECT_TRUE(seq.ok()) << seq.status();
  if (!seq.ok()) return -1;
  auto plan = w.Snapshot(*seq, 1024, testing::RampScores(64));
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok() || !plan->has_schedule()) return -1;
  return plan->schedule().h2d_bytes_per_second();
}

// Row 10 of issue 31: a link_id is one tenant's word. Another uid declaring the same link_id on
// another NUMA node, or at 1 B/s, neither refuses a worker nor lowers its grant.
TEST(LinkDeclarationTest, AnotherUidsDeclarationOfALinkNeitherRefusesNorThrottles) {
  Env alone(SmallOptions(32ull << 20, 8ull << 20)), squatted(SmallOptions(32ull << 20, 8ull << 20));
  const edge::PeerCredentials squatter{getuid() + 4242, getgid(), getpid(), {}};
  SimWorker far(squatted.core.get(), LinkedRequest("sw0", 50e9, 0, 2, /*numa=*/3), squatter);
  SimWorker slow(squatted.core.get(), LinkedRequest("sw1", 1, 0, 2, /*numa=*/0), squatter);
  ASSERT_NE(far.id(), 0u);
  ASSERT_NE(slow.id(), 0u);
  absl::StatusOr<v1::RegisterWorkerResponse> on0 =
      testing::Register(squatted.core.get(), LinkedRequest("sw0", 50e9, 0, 2, /*numa=*/0));
  EXPECT_TRUE(on0.ok()) << on0.status();
  SimWorker victim(squatted.core.get(), LinkedRequest("sw1", 50e9, 0, 2, 0));
  SimWorker reference(alone.core.get(), LinkedRequest("sw1", 50e9, 0, 2, 0));
  const double grant = FirstGrant(victim);
  EXPECT_GT(grant, 1e6);
  EXPECT_DOUBLE_EQ(grant, FirstGrant(reference)) << "the squatter changed the victim's grant";
  EXPECT_DOUBLE_EQ(FirstGrant(slow), 1) << "a tenant's own figure still binds its own worker";
}

// An operator's [links] entry is the link: its bandwidth and NUMA node hold whatever workers
// declare (a lower declaration caps only its own worker), and workers of every uid share it.
TEST(LinkDeclarationTest, AnOperatorsLinkEntryOverridesDeclarationsAndIsSharedByAllUids) {
  CoreOptions o = SmallOptions(32ull << 20, 8ull << 20);
  o.links = {LinkEntry{"sw0", 2e7, 1}};
  Env env(o);
  const edge::PeerCredentials other{getuid() + 4242, getgid(), getpid(), {}};
  SimWorker slow(env.core.get(), LinkedRequest("sw0", 1, 0, 2, /*numa=*/5), other);
  SimWorker fast(env.core.get(), LinkedRequest("sw0", 1e12, 0, 2, /*numa=*/0));
  ASSERT_NE(slow.id(), 0u) << "its NUMA node is the table's, not a reason to refuse";
  ASSERT_NE(fast.id(), 0u);
  EXPECT_DOUBLE_EQ(FirstGrant(slow), 1);
  const double grant = FirstGrant(fast);
  EXPECT_GT(grant, 1e6);
  EXPECT_LE(grant, 2e7) << "the table's bandwidth, not the declared 1e12";
}

}  // namespace
}  // namespace kvtier::daemon
