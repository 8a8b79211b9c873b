#include "daemon/kvtierd/status_page.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/kvtierctl/status_view.h"

namespace kvtier::daemon {
namespace {

using ctl::StatusView;

struct Segment {
  double value = 0;
  const char* color = "";
  std::string label;
};

// A horizontal bar: `segments` side by side out of `total`, on a grey track. Its text (the
// segments' labels) is the SVG's accessible name and tooltip.
std::string Bar(const std::vector<Segment>& segments, double total, int width, int height) {
  std::string label;
  for (const Segment& s : segments) absl::StrAppend(&label, label.empty() ? "" : ", ", s.label);
  std::string out = absl::StrFormat(
      "<svg width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"%s\"><title>%s</title>"
      "<rect width=\"%d\" height=\"%d\" fill=\"#e4e4e4\"/>",
      width, height, EscapeHtml(label), EscapeHtml(label), width, height);
  double x = 0;
  for (const Segment& s : segments) {
    if (total <= 0 || s.value <= 0) continue;
    const double w = std::min(width - x, width * s.value / total);
    absl::StrAppendFormat(&out, "<rect x=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>", x, w,
                          height, s.color);
    x += w;
  }
  return absl::StrCat(out, "</svg>");
}

constexpr const char* kTierColors[] = {"#2e7d32", "#1565c0", "#8e24aa", "#9e9e9e"};

std::string Head(int refresh_seconds) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
      refresh_seconds > 0
          ? absl::StrFormat("<meta http-equiv=\"refresh\" content=\"%d\">", refresh_seconds)
          : "",
      "<title>kvtierd status</title><style>"
      "body{font:14px sans-serif;margin:1.5em;color:#222}"
      "table{border-collapse:collapse;margin-bottom:1em}"
      "th,td{padding:3px 8px;text-align:right;white-space:nowrap}"
      "th{border-bottom:1px solid #999}.l{text-align:left}"
      "tr.worker td{font-weight:bold;background:#f2f2f2}"
      "tr:not(.worker) td:first-child{padding-left:22px}"
      ".note{color:#555}.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}"
      "</style></head><body>\n");
}

std::string Summary(const StatusView& v) {
  std::string out = "<h1>kvtierd</h1>\n<table id=\"summary\">";
  for (const auto& [label, value] : v.summary) {
    absl::StrAppend(&out, "<tr><th class=\"l\">", EscapeHtml(label), "</th><td class=\"l\">",
                    EscapeHtml(value), "</td></tr>");
  }
  return absl::StrCat(out, "</table>\n");
}

std::string Pools(const StatusView& v) {
  std::string out = "<h2>Pools</h2>\n<table id=\"pools\">";
  for (const ctl::PoolView& p : v.pools) {
    const double cap = static_cast<double>(p.capacity);
    absl::StrAppend(&out, "<tr><th class=\"l\">", EscapeHtml(p.name), "</th><td>",
                    Bar({{static_cast<double>(p.used), "#1565c0", "used"},
                         {static_cast<double>(p.draining), "#ef6c00", "draining"}},
                        cap, 320, 14),
                    "</td><td class=\"l\">", EscapeHtml(p.text), "</td></tr>");
  }
  return absl::StrCat(out, "</table>\n");
}

std::string Links(const StatusView& v) {
  std::string out = "<h2>Host links</h2>\n";
  if (v.links.empty()) return absl::StrCat(out, "<p class=\"note\">No shared host link.</p>\n");
  absl::StrAppend(&out,
                  "<table id=\"links\"><tr><th class=\"l\">link</th><th class=\"l\">scope"
                  "</th><th>NUMA</th><th class=\"l\">granted</th><th class=\"l\"></th></tr>");
  for (const ctl::LinkView& l : v.links) {
    absl::StrAppend(&out, "<tr><td class=\"l\">", EscapeHtml(l.link_id), "</td><td class=\"l\">",
                    EscapeHtml(l.scope), "</td><td>", l.numa_node, "</td><td>",
                    Bar({{l.granted, "#1565c0", "granted"}}, l.bytes_per_second, 240, 14),
                    "</td><td class=\"l\">", EscapeHtml(l.text), "</td></tr>");
  }
  return absl::StrCat(out, "</table>\n");
}

std::string Rows(const StatusView& v) {
  std::string out = "<h2>Workers and sequences</h2>\n";
  if (v.rows.empty()) {
    return absl::StrCat(out, "<p class=\"note\">No worker registered.</p>\n");
  }
  absl::StrAppend(&out, "<table id=\"rows\"><tr>");
  for (size_t i = 0; i < ctl::kViewColumns.size(); ++i) {
    absl::StrAppend(&out, i < 2 ? "<th class=\"l\">" : "<th>", EscapeHtml(ctl::kViewColumns[i]),
                    "</th>", i == 3 ? "<th class=\"l\">TIERS</th>" : "");
  }
  absl::StrAppend(&out, "</tr>\n");
  for (const ctl::ViewRow& r : v.rows) {
    absl::StrAppend(&out, r.worker ? "<tr class=\"worker\">" : "<tr>");
    for (size_t i = 0; i < r.cells.size(); ++i) {
      absl::StrAppend(&out, i < 2 ? "<td class=\"l\">" : "<td>", EscapeHtml(r.cells[i]), "</td>");
      if (i != 3) continue;
      std::vector<Segment> tiers;
      double total = 0;
      for (int t = 0; t < 4; ++t) {
        const double n = static_cast<double>(r.tokens[t]);
        tiers.push_back({n, kTierColors[t], absl::StrCat("T", t, " ", r.tokens[t])});
        total += n;
      }
      absl::StrAppend(&out, "<td class=\"l\">", Bar(tiers, total, 160, 12), "</td>");
    }
    absl::StrAppend(&out, "</tr>\n");
  }
  absl::StrAppend(&out, "</table>\n<p class=\"note\">TIERS:");
  const char* names[] = {"T0 (HBM)", "T1 (DDR)", "T2 (compressed)", "T3 (evicted)"};
  for (int t = 0; t < 4; ++t) {
    absl::StrAppend(&out, "<span class=\"key\" style=\"background:", kTierColors[t], "\"></span>",
                    names[t]);
  }
  return absl::StrCat(out, "</p>\n");
}

}  // namespace

std::string EscapeHtml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderStatusPage(const v1::GetStatusResponse& status, int refresh_seconds) {
  const StatusView v = ctl::BuildStatusView(status, /*redact=*/true);
  return absl::StrCat(
      Head(refresh_seconds), Summary(v), Pools(v), Links(v), Rows(v),
      "<p class=\"note\">Worker names, process ids and sequence tags are left out: anyone who "
      "reaches this address reads this page. <code>kvtierctl top</code> shows them to operators. "
      "Prometheus metrics: <a href=\"metrics\">/metrics</a>.</p>\n</body></html>\n");
}

}  // namespace kvtier::daemon
