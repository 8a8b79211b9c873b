#include "daemon/metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <regex>
#include <set>

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

std::string Scrape(const Metrics& m) {
  prometheus::TextSerializer s;
  return s.Serialize(m.registry()->Collect());
}

TEST(MetricsTest, NamesFollowConventionAndCountersEndInTotal) {
  auto m = Metrics::Create();
  m->CountError(Metrics::Rpc::kSubmitSnapshot, absl::StatusCode::kInvalidArgument);
  std::string text = Scrape(*m);
  std::regex type_line("# TYPE (\\S+) (\\S+)");
  std::set<std::string> names;
  for (std::sregex_iterator it(text.begin(), text.end(), type_line), end; it != end; ++it) {
    std::string name = (*it)[1], type = (*it)[2];
    names.insert(name);
    EXPECT_EQ(name.rfind("kvtier_", 0), 0u) << name;
    if (type == "counter") {
      EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
    }
  }
  for (const char* want :
       {"kvtier_pool_capacity_bytes", "kvtier_pool_used_bytes", "kvtier_placement_tokens",
        "kvtier_registry_workers", "kvtier_registry_sequences", "kvtier_snapshots_total",
        "kvtier_plan_latency_seconds", "kvtier_plan_moves_total", "kvtier_plan_moved_bytes_total",
        "kvtier_plan_evicted_tokens_total", "kvtier_plan_degraded_total",
        "kvtier_lease_expirations_total", "kvtier_rpc_errors_total", "kvtier_hbm_saved_bytes"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
}

TEST(MetricsTest, UpdatesShowInScrape) {
  auto m = Metrics::Create();
  m->SetPool(tiering::Tier::kT1, 1000, 256, 512, 1);
  m->CountMove(tiering::MoveKind::kOffload, 4096);
  m->CountMove(tiering::MoveKind::kOffload, 4096);
  m->CountSnapshot(0.002);
  m->CountError(Metrics::Rpc::kAckPlan, absl::StatusCode::kFailedPrecondition);
  std::string text = Scrape(*m);
  EXPECT_NE(text.find("kvtier_pool_used_bytes{tier=\"T1\"} 256"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_plan_moves_total{kind=\"offload\"} 2"), std::string::npos);
  EXPECT_NE(text.find("kvtier_plan_moved_bytes_total{kind=\"offload\"} 8192"), std::string::npos);
  EXPECT_NE(text.find("kvtier_snapshots_total 1"), std::string::npos);
  EXPECT_NE(text.find("code=\"failed_precondition\""), std::string::npos);
}

TEST(MetricsTest, ErrorSeriesOfTheCoresCodesExistBeforeTheFirstError) {
  auto m = Metrics::Create();
  std::string before = Scrape(*m);
  const std::string series = "kvtier_rpc_errors_total{code=\"not_found\",rpc=\"SubmitSnapshot\"} ";
  ASSERT_NE(before.find(series + "0"), std::string::npos) << before;
  m->CountError(Metrics::Rpc::kSubmitSnapshot, absl::StatusCode::kNotFound);
  EXPECT_NE(Scrape(*m).find(series + "1"), std::string::npos);
}

TEST(MetricsTest, TwoInstancesAreIndependent) {
  auto a = Metrics::Create();
  auto b = Metrics::Create();
  a->CountSnapshot(0.001);
  EXPECT_NE(Scrape(*a).find("kvtier_snapshots_total 1"), std::string::npos);
  EXPECT_NE(Scrape(*b).find("kvtier_snapshots_total 0"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::daemon
