// dashboards/kvtier.json uses only metric names that daemon/metrics defines (STYLE.md rule 9):
// the metric names in every PromQL expression of the dashboard must be families of a real
// daemon::Metrics registry (histograms as _bucket, _sum, _count).

#include <prometheus/registry.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvtier {
namespace {

// Label names of each exported name (histogram buckets also carry "le").
using LabelIndex = std::map<std::string, std::set<std::string>>;

// Names exported by a registry, as they appear in PromQL. prometheus-cpp leaves a family with no
// series out of Collect(), so the one family whose series appear on first use (errors, labelled
// by code) gets one.
LabelIndex ExportedNames() {
  std::unique_ptr<daemon::Metrics> metrics = daemon::Metrics::Create();
  metrics->CountError(daemon::Metrics::Rpc::kGetStatus, absl::StatusCode::kNotFound);
  LabelIndex names;
  for (const prometheus::MetricFamily& family : metrics->registry()->Collect()) {
    std::set<std::string> labels;
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) labels.insert(l.name);
    }
    if (family.type == prometheus::MetricType::Histogram) {
      for (const char* suffix : {"_sum", "_count"}) names[family.name + suffix] = labels;
      labels.insert("le");
      names[family.name + "_bucket"] = labels;
    } else {
      names[family.name] = labels;
    }
  }
  return names;
}

// Label names an expression filters or groups by: matchers {a="x"} and by/without (a, b).
std::set<std::string> LabelNames(const std::string& expr) {
  static const std::regex kMatcher(R"(([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=))");
  static const std::regex kBlock(R"(\{([^}]*)\})");
  static const std::regex kGroup(R"(\b(?:by|without)\s*\(([^)]*)\))");
  static const std::regex kName(R"([a-zA-Z_][a-zA-Z0-9_]*)");
  std::set<std::string> labels;
  auto collect = [&](const std::regex& outer, const std::regex& inner) {
    for (auto b = std::sregex_iterator(expr.begin(), expr.end(), outer);
         b != std::sregex_iterator(); ++b) {
      const std::string body = (*b)[1].str();
      for (auto it = std::sregex_iterator(body.begin(), body.end(), inner);
           it != std::sregex_iterator(); ++it) {
        labels.insert((*it)[1].matched ? (*it)[1].str() : it->str());
      }
    }
  };
  collect(kBlock, kMatcher);
  collect(kGroup, kName);
  return labels;
}

nlohmann::json LoadDashboard() {
  const char* dir = std::getenv("KVTIER_SOURCE_DIR");
  std::ifstream in(std::string(dir ? dir : ".") + "/dashboards/kvtier.json");
  EXPECT_TRUE(in.good()) << "cannot read dashboards/kvtier.json (KVTIER_SOURCE_DIR)";
  return nlohmann::json::parse(in);
}

// Every PromQL expression: panel targets (rows included) and query variables.
std::vector<std::string> Expressions(const nlohmann::json& dashboard) {
  std::vector<std::string> exprs;
  std::vector<const nlohmann::json*> panels;
  for (const auto& p : dashboard.at("panels")) {
    panels.push_back(&p);
    for (const auto& child : p.value("panels", nlohmann::json::array())) panels.push_back(&child);
  }
  for (const nlohmann::json* p : panels) {
    for (const auto& t : p->value("targets", nlohmann::json::array())) {
      exprs.push_back(t.at("expr").get<std::string>());
    }
  }
  for (const auto& v : dashboard.at("templating").at("list")) {
    if (v.value("type", "") == "query") exprs.push_back(v.at("definition").get<std::string>());
  }
  return exprs;
}

// Metric names in a PromQL expression: identifiers outside strings, label matchers {..}, range
// selectors [..] and grouping clauses (by/without/on/ignoring (..)), that are not function
// calls, keywords or numbers. label_values(metric, label) counts its first argument.
std::set<std::string> MetricNames(std::string expr) {
  static const std::regex kStrings(R"("([^"\\]|\\.)*")");
  static const std::regex kMatchers(R"(\{[^}]*\})");
  static const std::regex kRanges(R"(\[[^\]]*\])");
  static const std::regex kGrouping(
      R"(\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))");
  static const std::regex kLabelValues(R"(label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,[^)]*\))");
  static const std::regex kIdent(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  static const std::set<std::string> kKeywords = {"and", "or",  "unless", "bool", "offset",
                                                  "inf", "nan", "Inf",    "NaN"};
  expr = std::regex_replace(expr, kLabelValues, "$1");
  for (const std::regex* r : {&kStrings, &kMatchers, &kRanges, &kGrouping}) {
    expr = std::regex_replace(expr, *r, " ");
  }
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kIdent);
       it != std::sregex_iterator(); ++it) {
    const size_t end = it->position() + it->length();
    size_t next = expr.find_first_not_of(" \t\n", end);
    bool is_call = next != std::string::npos && expr[next] == '(';
    bool in_number = it->position() > 0 && std::isdigit(expr[it->position() - 1]);
    if (!is_call && !in_number && !kKeywords.count(it->str())) names.insert(it->str());
  }
  return names;
}

TEST(DashboardMetricsTest, ExtractorFindsMetricsAndSkipsLabelsFunctionsAndKeywords) {
  EXPECT_THAT(MetricNames("histogram_quantile(0.99, sum by (le) (rate(x_bucket{a=\"b\"}[5m])))"),
              ::testing::ElementsAre("x_bucket"));
  EXPECT_THAT(MetricNames("sum(a{tier=\"T3\"}) / sum without (tier) (b) or vector(0)"),
              ::testing::ElementsAre("a", "b"));
  EXPECT_THAT(MetricNames("label_values(w, instance)"), ::testing::ElementsAre("w"));
  EXPECT_THAT(MetricNames("rate(c_total[$__rate_interval]) > bool 1e3"),
              ::testing::ElementsAre("c_total"));
}

TEST(DashboardMetricsTest, LabelExtractorFindsMatchersAndGroupings) {
  EXPECT_THAT(LabelNames("sum by (tier, reason) (rate(a{kind=\"x\",code!~\"y\"}[1m]))"),
              ::testing::ElementsAre("code", "kind", "reason", "tier"));
}

TEST(DashboardMetricsTest, EveryMetricTheDashboardUsesIsExportedByTheDaemon) {
  const LabelIndex exported = ExportedNames();
  ASSERT_FALSE(exported.empty());
  const std::vector<std::string> exprs = Expressions(LoadDashboard());
  ASSERT_GE(exprs.size(), 10u) << "the dashboard lost its panels";
  std::set<std::string> used;
  for (const std::string& expr : exprs) {
    std::set<std::string> names = MetricNames(expr);
    EXPECT_FALSE(names.empty()) << "no metric in: " << expr;
    std::set<std::string> labels = {"instance", "job"};  // added by Prometheus
    for (const std::string& name : names) {
      EXPECT_TRUE(exported.count(name)) << name << " (in " << expr << ") is not defined in "
                                        << "daemon/metrics";
      used.insert(name);
      if (exported.count(name)) labels.insert(exported.at(name).begin(), exported.at(name).end());
    }
    for (const std::string& label : LabelNames(expr)) {
      EXPECT_TRUE(labels.count(label))
          << "label " << label << " (in " << expr << ") is on none of its metrics";
    }
  }
  // The concerns of the dashboard, each backed by its metric.
  for (const char* name :
       {"kvtier_hbm_saved_bytes", "kvtier_pool_used_bytes", "kvtier_pool_capacity_bytes",
        "kvtier_plan_latency_seconds_bucket", "kvtier_plan_moved_bytes_total",
        "kvtier_plan_evicted_tokens_total", "kvtier_plan_degraded_total", "kvtier_registry_workers",
        "kvtier_lease_expirations_total", "kvtier_rpc_errors_total"}) {
    EXPECT_TRUE(used.count(name)) << "the dashboard does not show " << name;
  }
}

TEST(DashboardMetricsTest, EveryPanelHasAUnitAndEveryRowAPanel) {
  const nlohmann::json dashboard = LoadDashboard();
  EXPECT_GE(dashboard.at("schemaVersion").get<int>(), 36);
  int rows = 0;
  int panels_in_row = 1;
  for (const auto& p : dashboard.at("panels")) {
    if (p.at("type") == "row") {
      EXPECT_GT(panels_in_row, 0) << "empty row before " << p.at("title");
      ++rows;
      panels_in_row = 0;
      continue;
    }
    ++panels_in_row;
    const std::string unit = p.at("fieldConfig").at("defaults").value("unit", "");
    EXPECT_FALSE(unit.empty()) << "panel \"" << p.at("title") << "\" has no unit";
  }
  EXPECT_GE(rows, 8);
}

}  // namespace
}  // namespace kvtier
