// The live view's rows (client/kvtierctl/status_view.h), `kvtierctl top`'s frame and kvtierd's
// status page, from one hand-made status.

#include "client/kvtierctl/status_view.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "client/kvtierctl/top_command.h"
#include "daemon/kvtierd/status_page.h"

namespace kvtier {
namespace {

v1::GetStatusResponse Sample() {
  v1::GetStatusResponse s;
  s.set_version("9.9.9");
  s.set_uptime_ms(65000);
  s.set_workers(2);
  s.set_sequences(3);
  s.set_hbm_saved_bytes(3 << 20);
  s.set_view("all");
  v1::PoolStatus* ddr = s.add_pools();
  ddr->set_kind(v1::POOL_KIND_DDR);
  ddr->set_capacity_bytes(1 << 30);
  ddr->set_used_bytes(256 << 20);
  ddr->set_slots_used(17);
  v1::PoolStatus* cmp = s.add_pools();
  cmp->set_kind(v1::POOL_KIND_COMPRESSED);
  cmp->set_capacity_bytes(512 << 20);
  v1::LinkStatus* link = s.add_links();
  link->set_link_id("0000:3a:00.0");
  link->set_scope("operator");
  link->set_bytes_per_second(25e9);
  link->set_granted_bytes_per_second(12.5e9);
  link->set_workers(2);
  for (uint64_t w : {2, 1}) {  // out of order: the view sorts
    v1::WorkerStatus* ws = s.add_worker_list();
    ws->set_worker_id(w);
    ws->set_worker_name(w == 1 ? "pod<x>&\"y\"" : "pod-b");
    ws->set_model_name("llama");
    ws->set_pid(100 + static_cast<int>(w));
    ws->set_ddr_bytes(1 << 20);
    ws->set_compressed_bytes(1 << 20);
    ws->set_plans(10);
    ws->set_degraded_plans(3);
    ws->set_plans_per_second(0.5);
    ws->set_lease_age_ms(1200);
    ws->set_lease_remaining_ms(8800);
  }
  const uint64_t seqs[][6] = {
      {11, 1, 300, 100, 150, 50}, {12, 1, 64, 64, 0, 0}, {21, 2, 1000, 200, 700, 0}};
  for (const auto& q : seqs) {
    v1::SequenceStatus* ss = s.add_sequence_list();
    ss->set_sequence_id(q[0]);
    ss->set_worker_id(q[1]);
    ss->set_length(q[2]);
    ss->set_tag(absl::StrCat("req-<", q[0], ">"));
    ss->set_policy("hierarchy");
    ss->mutable_report()->set_tokens_t0(q[3]);
    ss->mutable_report()->set_tokens_t1(q[4]);
    ss->mutable_report()->set_tokens_t2(q[5]);
    ss->mutable_report()->set_full_bytes(q[2] * 1024);
    ss->mutable_report()->set_t0_bytes(q[3] * 1024);
    ss->set_plans(4);
    ss->set_degraded_plans(1);
  }
  // s11 reported its guardrail; s12 and s21 never did.
  v1::SequenceLostMass* lost = s.mutable_sequence_list(0)->mutable_lost_mass();
  lost->set_compressed(0.01);
  lost->set_evicted_estimate(0.0025);
  lost->set_total(0.0125);
  lost->set_peak_total(0.03);
  lost->set_reports(2);
  return s;
}

TEST(StatusViewTest, WorkersComeInIdOrderEachFollowedByItsSequencesWithSums) {
  const ctl::StatusView v = ctl::BuildStatusView(Sample());
  ASSERT_EQ(v.rows.size(), 5u);
  const char* ids[] = {"w1", "  s11", "  s12", "w2", "  s21"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(v.rows[i].cells[0], ids[i]);
  const ctl::ViewRow& w1 = v.rows[0];
  EXPECT_TRUE(w1.worker);
  EXPECT_EQ(w1.cells[2], "364");  // TOKENS: 300 + 64
  EXPECT_EQ(w1.cells[4], "164");  // T0: 100 + 64
  EXPECT_EQ(w1.cells[5], "150");
  EXPECT_EQ(w1.cells[6], "50");
  EXPECT_EQ(w1.hbm_saved, 200u * 1024);  // (300 - 100) x 1 KiB; s12 saves nothing
  EXPECT_EQ(w1.cells[3], "200.0 KiB");
  EXPECT_EQ(w1.cells[8], "2.0 MiB");  // DDR used: both pools
  EXPECT_EQ(w1.cells[9], "0.50");
  EXPECT_EQ(w1.cells[10], "3/10");
  EXPECT_EQ(w1.cells[12], "1.2s");
  EXPECT_EQ(v.rows[1].cells[11], "1.25% (peak 3.00%)") << "s11's lost mass: total and peak";
  EXPECT_EQ(v.rows[2].cells[11], "\u2014") << "lost mass: a dash until it is reported";
  EXPECT_EQ(v.rows[4].cells[11], "\u2014");
  EXPECT_EQ(w1.cells[11], "") << "a worker row has none of its own";
  EXPECT_EQ(v.rows[1].cells[10], "1/4");
  ASSERT_EQ(v.pools.size(), 2u);
  EXPECT_EQ(v.pools[0].text, "256.0 MiB / 1.0 GiB (25.0%)");
  ASSERT_EQ(v.links.size(), 1u);
  EXPECT_EQ(v.links[0].text, "12.5 GB/s of 25.0 GB/s granted to 2 workers");
}

TEST(StatusViewTest, RedactedViewLeavesOutNamesPidsAndTags) {
  const ctl::StatusView v = ctl::BuildStatusView(Sample(), /*redact=*/true);
  for (const ctl::ViewRow& r : v.rows) {
    for (const std::string& cell : r.cells) {
      EXPECT_FALSE(absl::StrContains(cell, "pod")) << cell;
      EXPECT_FALSE(absl::StrContains(cell, "req-")) << cell;
      EXPECT_FALSE(absl::StrContains(cell, "pid")) << cell;
    }
  }
  EXPECT_EQ(v.rows[0].cells[1], "llama");
}

TEST(TopFrameTest, FrameHasTotalsPoolsLinksAndAlignedRows) {
  const std::string frame = ctl::RenderTopFrame(Sample(), "");
  EXPECT_TRUE(absl::StartsWith(frame,
                               "kvtierd 9.9.9  uptime 1m05s  workers 2  sequences 3  "
                               "HBM saved 3.0 MiB\n"))
      << frame;
  EXPECT_TRUE(absl::StrContains(frame, "256.0 MiB / 1.0 GiB (25.0%)")) << frame;
  EXPECT_TRUE(absl::StrContains(frame, "0000:3a:00.0")) << frame;
  EXPECT_TRUE(absl::StrContains(frame, "pod<x>&\"y\" (llama, pid 101)")) << frame;
  EXPECT_TRUE(absl::StrContains(frame, "1.25% (peak 3.00%)")) << frame;
  EXPECT_FALSE(absl::StrContains(frame, "\x1b")) << "escapes belong to the terminal loop";
  // Columns line up: w1's lease age ends where its header does (numbers are right-aligned).
  std::vector<std::string> lines = absl::StrSplit(frame, '\n');
  size_t header = 0;
  while (header < lines.size() && !absl::StartsWith(lines[header], "ID")) ++header;
  ASSERT_LT(header + 5, lines.size()) << frame;
  const size_t lease = lines[header].find("LEASE AGE");
  ASSERT_NE(lease, std::string::npos);
  EXPECT_EQ(lines[header + 1].find("1.2s") + 4, lease + 9) << frame;
  EXPECT_TRUE(absl::StrContains(ctl::RenderTopFrame(Sample(), "uid 7 is not an operator"),
                                "(node totals only: uid 7 is not an operator)"));
}

TEST(StatusPageTest, PageEscapesTextAndCarriesNoScriptOrExternalAsset) {
  v1::GetStatusResponse s = Sample();
  s.mutable_worker_list(0)->set_model_name("<script>alert(1)</script>");
  const std::string page = daemon::RenderStatusPage(s);
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
  EXPECT_FALSE(absl::StrContains(page, "<script")) << page;
  EXPECT_TRUE(absl::StrContains(page, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_FALSE(absl::StrContains(page, "http://"));
  EXPECT_FALSE(absl::StrContains(page, "https://"));
  EXPECT_FALSE(absl::StrContains(page, "pod-b")) << "names are left out";
  EXPECT_FALSE(absl::StrContains(page, "req-")) << "tags are left out";
  EXPECT_TRUE(absl::StrContains(page, "<svg")) << "bars";
  EXPECT_TRUE(absl::StrContains(page, "256.0 MiB / 1.0 GiB (25.0%)"));
  EXPECT_TRUE(absl::StrContains(page, "12.5 GB/s of 25.0 GB/s granted to 2 workers"));
  EXPECT_TRUE(absl::StrContains(page, "<td>164</td>")) << "w1's T0 tokens";
  EXPECT_TRUE(absl::StrContains(page, "<td>1.25% (peak 3.00%)</td>")) << "s11's lost mass";
  EXPECT_TRUE(absl::StrContains(page, "<td>\u2014</td>")) << "s12's: none reported";
  EXPECT_TRUE(absl::StrContains(page, "<meta http-equiv=\"refresh\" content=\"5\">"));
  // The pool bar is a quarter full: 80 of its 320 pixels.
  EXPECT_TRUE(absl::StrContains(page, "width=\"80.0\" height=\"14\" fill=\"#1565c0\"")) << page;
}

TEST(StatusPageTest, EscapeHtmlCoversMarkupAndQuotes) {
  EXPECT_EQ(daemon::EscapeHtml("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
}

}  // namespace
}  // namespace kvtier
