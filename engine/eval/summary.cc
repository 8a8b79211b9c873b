// WriteSummary: OUT/results.csv -> OUT/summary.md.

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/eval/eval.h"
#include "engine/eval/metrics.h"

namespace kvtier::engine {
namespace {

struct Metric {
  const char* column;  // results.csv column, or "prefix_share"
  const char* heading;
};

constexpr Metric kMetrics[] = {
    {"top1_agreement", "top-1 agree"},    {"kl_mean", "KL (nats/step)"},
    {"prefix_share", "identical prefix"}, {"same_answer", "same answer"},
    {"fr_correct", "accuracy"},           {"evicted_fraction", "evicted"},
    {"t0_mean_ratio", "T0 mean / full"},  {"t0_peak_ratio", "T0 peak / full"},
    {"lost_mass_peak", "lost mass peak"},
};

std::string Cell(const Interval& i, bool small) {
  if (small) return absl::StrFormat("%.2e [%.2e, %.2e]", i.mean, i.lo, i.hi);
  return absl::StrFormat("%.3f [%.3f, %.3f]", i.mean, i.lo, i.hi);
}

}  // namespace

absl::Status WriteSummary(const std::string& out_dir) {
  const std::filesystem::path dir(out_dir);
  std::ifstream in(dir / "results.csv");
  if (!in) return absl::NotFoundError(absl::StrCat("no results.csv in ", out_dir));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header = absl::StrSplit(line, ',');
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::vector<double>>> values;
  std::map<std::string, double> ref_correct;  // per question line
  std::map<std::string, double> ref_tokens;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() != header.size()) continue;
    const std::string& config = f[col["config"]];
    if (!values.contains(config)) order.push_back(config);
    auto& v = values[config];
    for (const Metric& m : kMetrics) {
      if (std::string(m.column) == "prefix_share") {
        const double n = std::stod(f[col["ref_tokens"]]);
        v[m.column].push_back(n > 0 ? std::stod(f[col["identical_prefix"]]) / n : 1.0);
      } else {
        v[m.column].push_back(std::stod(f[col[m.column]]));
      }
    }
    ref_correct[f[col["line"]]] = std::stod(f[col["ref_correct"]]);
    ref_tokens[f[col["line"]]] = std::stod(f[col["ref_tokens"]]);
  }
  std::vector<double> refc, refn;
  for (auto& [q, v] : ref_correct) refc.push_back(v);
  for (auto& [q, v] : ref_tokens) refn.push_back(v);
  std::string md = "# kvtier-run eval summary\n\n";
  absl::StrAppendFormat(&md,
                        "%d questions. Full-cache reference: accuracy %s, generated tokens "
                        "%s (means, 95%% bootstrap intervals).\n\n",
                        refc.size(), Cell(Bootstrap(refc), false), Cell(Bootstrap(refn), false));
  md += "| config | n |";
  for (const Metric& m : kMetrics) absl::StrAppend(&md, " ", m.heading, " |");
  md += "\n|---|---|";
  for (size_t i = 0; i < std::size(kMetrics); ++i) md += "---|";
  md += "\n";
  for (const std::string& config : order) {
    auto& v = values[config];
    absl::StrAppend(&md, "| ", config, " | ", v["top1_agreement"].size(), " |");
    for (const Metric& m : kMetrics) {
      absl::StrAppend(&md, " ", Cell(Bootstrap(v[m.column]), std::string(m.column) == "kl_mean"),
                      " |");
    }
    md += "\n";
  }
  std::ofstream(dir / "summary.md") << md;
  return absl::OkStatus();
}

}  // namespace kvtier::engine
