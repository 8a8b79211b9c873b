// Every field of every request with bad values: the right code, a message naming the field, and
// the core keeps serving a well-behaved worker afterwards.

#include <cmath>
#include <functional>
#include <limits>

#include "daemon/daemon_core.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using absl::StatusCode;
using testing::Env;
using testing::Policy;
using testing::RampScores;
using testing::SimWorker;

template <typename Req>
struct BadCase {
  const char* what;
  std::function<void(Req&)> mutate;
  StatusCode code;
  const char* field;  // must appear in the message
};

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    good_ = std::make_unique<SimWorker>(env_.core.get());
    good_seq_ = *good_->Open(16, Policy("hierarchy", 0.3, 0.1, 0.1));
    other_ = std::make_unique<SimWorker>(env_.core.get());
    other_seq_ = *other_->Open(16, Policy("hierarchy", 0.3, 0.1, 0.1));
  }
  // The well-behaved worker can still do a full round.
  void ExpectStillServing() {
    auto& s = good_->seq(good_seq_);
    auto plan = good_->Snapshot(good_seq_, std::max<uint64_t>(s.length, 200), RampScores(40));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(good_->Ack(*plan, true).ok());
  }
  // `make_base` builds a valid request at the time of each case.
  template <typename Req, typename Make, typename Call>
  void Run(Make make_base, const std::vector<BadCase<Req>>& cases, Call call) {
    for (const auto& c : cases) {
      Req r = make_base();
      c.mutate(r);
      absl::Status st = call(r);
      EXPECT_EQ(st.code(), c.code) << c.what << ": " << st;
      EXPECT_NE(st.message().find(c.field), std::string::npos)
          << c.what << ": message \"" << st.message() << "\" does not name " << c.field;
      ExpectStillServing();
    }
  }

  Env env_;
  std::unique_ptr<SimWorker> good_, other_;
  uint64_t good_seq_ = 0, other_seq_ = 0;
};

TEST_F(ValidationTest, RegisterWorkerRejectsEveryBadField) {
  using R = v1::RegisterWorkerRequest;
  std::vector<BadCase<R>> cases = {
      {"no geometry", [](R& r) { r.clear_geometry(); }, StatusCode::kInvalidArgument, "geometry"},
      {"zero layers", [](R& r) { r.mutable_geometry()->set_num_layers(0); },
       StatusCode::kInvalidArgument, "geometry.num_layers"},
      {"huge layers", [](R& r) { r.mutable_geometry()->set_num_layers(1u << 31); },
       StatusCode::kInvalidArgument, "geometry.num_layers"},
      {"zero heads", [](R& r) { r.mutable_geometry()->set_num_kv_heads(0); },
       StatusCode::kInvalidArgument, "geometry.num_kv_heads"},
      {"huge heads", [](R& r) { r.mutable_geometry()->set_num_kv_heads(~0u); },
       StatusCode::kInvalidArgument, "geometry.num_kv_heads"},
      {"zero head_dim", [](R& r) { r.mutable_geometry()->set_head_dim(0); },
       StatusCode::kInvalidArgument, "geometry.head_dim"},
      {"huge head_dim", [](R& r) { r.mutable_geometry()->set_head_dim(1u << 20); },
       StatusCode::kInvalidArgument, "geometry.head_dim"},
      {"element_bytes 3", [](R& r) { r.mutable_geometry()->set_element_bytes(3); },
       StatusCode::kInvalidArgument, "geometry.element_bytes"},
      {"element_bytes 0", [](R& r) { r.mutable_geometry()->set_element_bytes(0); },
       StatusCode::kInvalidArgument, "geometry.element_bytes"},
      {"zero page_tokens", [](R& r) { r.mutable_geometry()->set_page_tokens(0); },
       StatusCode::kInvalidArgument, "geometry.page_tokens"},
      {"huge page_tokens", [](R& r) { r.mutable_geometry()->set_page_tokens(1u << 30); },
       StatusCode::kInvalidArgument, "geometry.page_tokens"},
      {"zero groups", [](R& r) { r.mutable_geometry()->set_layer_groups(0); },
       StatusCode::kInvalidArgument, "geometry.layer_groups"},
      {"groups > layers", [](R& r) { r.mutable_geometry()->set_layer_groups(5); },
       StatusCode::kInvalidArgument, "geometry.layer_groups"},
      {"long model name", [](R& r) { r.mutable_geometry()->set_model_name(std::string(300, 'x')); },
       StatusCode::kInvalidArgument, "geometry.model_name"},
      {"long worker name", [](R& r) { r.set_worker_name(std::string(300, 'x')); },
       StatusCode::kInvalidArgument, "worker_name"},
      {"negative pid", [](R& r) { r.set_pid(-5); }, StatusCode::kInvalidArgument, "pid"},
      {"t1 too small", [](R& r) { r.set_t1_page_bytes(100); }, StatusCode::kInvalidArgument,
       "t1_page_bytes"},
      {"t1 zero", [](R& r) { r.set_t1_page_bytes(0); }, StatusCode::kInvalidArgument,
       "t1_page_bytes"},
      {"t1 above pool", [](R& r) { r.set_t1_page_bytes(1ull << 40); }, StatusCode::kInvalidArgument,
       "t1_page_bytes"},
      {"t2 zero", [](R& r) { r.set_t2_page_bytes(0); }, StatusCode::kInvalidArgument,
       "t2_page_bytes"},
      {"t2 above pool", [](R& r) { r.set_t2_page_bytes(1ull << 40); }, StatusCode::kInvalidArgument,
       "t2_page_bytes"},
  };
  Run([] { return testing::WorkerRequest(); }, cases,
      [&](const R& r) { return testing::Register(env_.core.get(), r).status(); });
}

TEST_F(ValidationTest, OpenSequenceRejectsEveryBadField) {
  using R = v1::OpenSequenceRequest;
  R base;
  base.set_worker_id(good_->id());
  base.set_session_secret(good_->secret());
  base.set_prompt_tokens(10);
  *base.mutable_policy() = Policy("hierarchy", 0.5, 0.1, 0.1);
  std::vector<BadCase<R>> cases = {
      {"unknown worker", [](R& r) { r.set_worker_id(7); }, StatusCode::kNotFound, "worker_id"},
      {"huge prompt", [](R& r) { r.set_prompt_tokens(1ull << 50); }, StatusCode::kInvalidArgument,
       "prompt_tokens"},
      {"long tag", [](R& r) { r.set_tag(std::string(1000, 't')); }, StatusCode::kInvalidArgument,
       "tag"},
      {"protected begin past the prompt", [](R& r) { r.set_protected_prompt_begin(11); },
       StatusCode::kInvalidArgument, "protected_prompt_begin"},
      {"no policy", [](R& r) { r.clear_policy(); }, StatusCode::kInvalidArgument, "policy.name"},
      {"unknown policy", [](R& r) { r.mutable_policy()->set_name("lru"); },
       StatusCode::kInvalidArgument, "policy.name"},
      {"worker-side policy", [](R& r) { r.mutable_policy()->set_name("arkv"); },
       StatusCode::kInvalidArgument, "policy.name"},
      {"rkv", [](R& r) { r.mutable_policy()->set_name("rkv"); }, StatusCode::kInvalidArgument,
       "policy.name"},
      {"hbm > 1", [](R& r) { r.mutable_policy()->set_hbm_ratio(1.01); },
       StatusCode::kInvalidArgument, "policy.hbm_ratio"},
      {"hbm NaN", [](R& r) { r.mutable_policy()->set_hbm_ratio(NAN); },
       StatusCode::kInvalidArgument, "policy.hbm_ratio"},
      {"evict < 0", [](R& r) { r.mutable_policy()->set_evict_ratio(-1); },
       StatusCode::kInvalidArgument, "policy.evict_ratio"},
      {"compress inf", [](R& r) { r.mutable_policy()->set_compress_ratio(INFINITY); },
       StatusCode::kInvalidArgument, "policy.compress_ratio"},
      {"sum > 1",
       [](R& r) {
         r.mutable_policy()->set_evict_ratio(0.7);
         r.mutable_policy()->set_compress_ratio(0.4);
       },
       StatusCode::kInvalidArgument, "policy.evict_ratio + policy.compress_ratio"},
      {"huge sink", [](R& r) { r.mutable_policy()->set_sink_tokens(~0u); },
       StatusCode::kInvalidArgument, "policy.sink_tokens"},
      {"huge window", [](R& r) { r.mutable_policy()->set_window_tokens(~0u); },
       StatusCode::kInvalidArgument, "policy.window_tokens"},
      {"max_lost_mass < 0", [](R& r) { r.mutable_policy()->set_max_lost_mass(-0.1); },
       StatusCode::kInvalidArgument, "policy.max_lost_mass"},
      {"max_lost_mass NaN", [](R& r) { r.mutable_policy()->set_max_lost_mass(NAN); },
       StatusCode::kInvalidArgument, "policy.max_lost_mass"},
  };
  Run([&] { return base; }, cases, [&](const R& r) { return env_.core->OpenSequence(r).status(); });
}

TEST_F(ValidationTest, SubmitSnapshotRejectsEveryBadField) {
  using R = v1::SubmitSnapshotRequest;
  // 13 pages; the length stays put so that every case sees the same shape.
  auto make = [&] { return good_->MakeSnapshot(good_seq_, 200, RampScores(13)); };
  const uint64_t other_seq = other_seq_;
  std::vector<BadCase<R>> cases = {
      {"unknown worker", [](R& r) { r.set_worker_id(99); }, StatusCode::kNotFound, "worker_id"},
      {"unknown sequence", [](R& r) { r.set_sequence_id(424242); }, StatusCode::kNotFound,
       "sequence_id"},
      {"foreign sequence", [other_seq](R& r) { r.set_sequence_id(other_seq); },
       StatusCode::kPermissionDenied, "sequence_id"},
      {"zero length", [](R& r) { r.set_length(0); }, StatusCode::kInvalidArgument, "length"},
      {"length < prompt", [](R& r) { r.set_length(10); }, StatusCode::kInvalidArgument, "length"},
      {"num_pages off by one", [](R& r) { r.set_num_pages(14); }, StatusCode::kInvalidArgument,
       "num_pages"},
      {"length wraps page math",
       [](R& r) {
         r.set_length(~uint64_t{0});
         r.set_num_pages(0);
         r.clear_page_scores();
         r.clear_current_tiers();
       },
       StatusCode::kInvalidArgument, "length"},
      {"huge length", [](R& r) { r.set_length(1ull << 40); }, StatusCode::kInvalidArgument,
       "length"},
      {"num_pages mismatching a long length",
       [](R& r) {
         r.set_length(uint64_t{1} << 24);
         r.set_num_pages(1u << 30);
       },
       StatusCode::kInvalidArgument, "num_pages"},
      {"scores short", [](R& r) { r.mutable_page_scores()->RemoveLast(); },
       StatusCode::kInvalidArgument, "page_scores"},
      {"scores long", [](R& r) { r.add_page_scores(1); }, StatusCode::kInvalidArgument,
       "page_scores"},
      {"score NaN", [](R& r) { r.set_page_scores(5, NAN); }, StatusCode::kInvalidArgument,
       "page_scores[5]"},
      {"score inf", [](R& r) { r.set_page_scores(12, -INFINITY); }, StatusCode::kInvalidArgument,
       "page_scores[12]"},
      {"lost mass NaN", [](R& r) { r.mutable_lost_mass()->set_compressed(NAN); },
       StatusCode::kInvalidArgument, "lost_mass.compressed"},
      {"lost mass < 0", [](R& r) { r.mutable_lost_mass()->set_evicted_estimate(-1); },
       StatusCode::kInvalidArgument, "lost_mass.evicted_estimate"},
      {"tiers short", [](R& r) { r.mutable_current_tiers()->pop_back(); },
       StatusCode::kInvalidArgument, "current_tiers"},
      {"tiers long", [](R& r) { r.mutable_current_tiers()->push_back(0); },
       StatusCode::kInvalidArgument, "current_tiers"},
      {"tier byte 4", [](R& r) { (*r.mutable_current_tiers())[3] = 4; },
       StatusCode::kInvalidArgument, "current_tiers[3]"},
      {"tier byte 255", [](R& r) { (*r.mutable_current_tiers())[0] = static_cast<char>(255); },
       StatusCode::kInvalidArgument, "current_tiers[0]"},
      {"tier disagrees",
       [](R& r) {
         char& t = (*r.mutable_current_tiers())[2];
         t = t == 1 ? 0 : 1;
       },
       StatusCode::kFailedPrecondition, "current_tiers[2]"},
      {"stale plan", [](R& r) { r.set_last_plan_version(7); }, StatusCode::kFailedPrecondition,
       "last_plan_version"},
      {"ack of no plan in flight", [](R& r) { r.set_applied_plan_version(7); },
       StatusCode::kFailedPrecondition, "applied_plan_version"},
  };
  Run(make, cases, [&](const R& r) { return env_.core->SubmitSnapshot(r).status(); });
}

TEST_F(ValidationTest, AckAndCloseRejectBadIds) {
  auto plan = good_->Snapshot(good_seq_, 300, RampScores(19));
  ASSERT_TRUE(plan.ok());
  using A = v1::AckPlanRequest;
  A base;
  base.set_worker_id(good_->id());
  base.set_session_secret(good_->secret());
  base.set_sequence_id(good_seq_);
  base.set_plan_version(plan->plan_version());
  base.set_applied(true);
  const uint64_t other_seq = other_seq_, other_id = other_->id();
  std::vector<BadCase<A>> cases = {
      {"unknown worker", [](A& r) { r.set_worker_id(3); }, StatusCode::kNotFound, "worker_id"},
      {"unknown sequence", [](A& r) { r.set_sequence_id(3); }, StatusCode::kNotFound,
       "sequence_id"},
      {"foreign sequence", [other_seq](A& r) { r.set_sequence_id(other_seq); },
       StatusCode::kPermissionDenied, "sequence_id"},
      {"other worker acks", [other_id](A& r) { r.set_worker_id(other_id); },
       StatusCode::kPermissionDenied, "session_secret"},
      {"wrong version", [](A& r) { r.set_plan_version(99); }, StatusCode::kFailedPrecondition,
       "plan_version"},
  };
  // The good worker's plan is in flight: ack it inside ExpectStillServing's place.
  for (const auto& c : cases) {
    A r = base;
    c.mutate(r);
    absl::Status st = env_.core->AckPlan(r).status();
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.what << ": " << st;
  }
  ASSERT_TRUE(good_->Ack(*plan, true).ok());
  ExpectStillServing();

  v1::CloseSequenceRequest close;
  close.set_worker_id(good_->id());
  close.set_session_secret(good_->secret());
  close.set_sequence_id(12345);
  auto st = env_.core->CloseSequence(close).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("sequence_id"), std::string::npos);
  close.set_worker_id(0);
  EXPECT_EQ(env_.core->CloseSequence(close).status().code(), StatusCode::kNotFound);
  ExpectStillServing();
}

// Issue 31, row 6: the entries a worker's and the node's sequences hold are budgeted, so one
// worker's maximum-size snapshots on many sequences cannot grow the daemon's heap without bound.
// A refusal names the limit, the value and the ceiling; closing a sequence gives entries back.
TEST(EntryBudgetTest, SnapshotsPastTheWorkerOrNodeBudgetAreRefusedNamingTheLimit) {
  CoreOptions o = testing::SmallOptions();
  o.max_worker_entries = 100;
  o.max_node_entries = 150;
  Env env(o);
  SimWorker a(env.core.get()), b(env.core.get());
  const v1::PolicyConfig full = Policy("full", 1.0, 0.0, 0.0);
  auto s1 = a.Open(16, full), s2 = a.Open(16, full), s3 = b.Open(16, full);
  ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok());
  auto p1 = a.Snapshot(*s1, 64 * 16, RampScores(64));  // 64 entries held
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_TRUE(a.Ack(*p1, true).ok());
  auto p2 = a.Snapshot(*s2, 40 * 16, RampScores(40));  // 104 > 100
  ASSERT_FALSE(p2.ok());
  EXPECT_EQ(p2.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p2.status().message().find("limits.max_worker_entries (100)"), std::string::npos)
      << p2.status();
  EXPECT_NE(p2.status().message().find("would hold 104"), std::string::npos) << p2.status();
  auto p3 = b.Snapshot(*s3, 90 * 16, RampScores(90));  // 64 + 90 > 150 on the node
  ASSERT_FALSE(p3.ok());
  EXPECT_EQ(p3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p3.status().message().find("limits.max_node_entries (150)"), std::string::npos)
      << p3.status();
  // A sequence closed gives its entries back; a grown one may still grow within the budget.
  v1::CloseSequenceRequest close = a.Signed(v1::CloseSequenceRequest());
  close.set_sequence_id(*s1);
  ASSERT_TRUE(env.core->CloseSequence(close).ok());
  auto again = b.Snapshot(*s3, 90 * 16, RampScores(90));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(testing::CoreInvariants(env.core.get()).ok());
}

}  // namespace
}  // namespace kvtier::daemon
