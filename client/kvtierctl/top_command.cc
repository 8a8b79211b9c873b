#include "client/kvtierctl/top_command.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/kvtierctl/status_view.h"
#include "client/kvtierctl/table.h"

namespace kvtier::ctl {
namespace {

// Plain ANSI (ECMA-48): cursor home, erase to end of line, erase below, hide and show the cursor.
constexpr char kHome[] = "\x1b[H";
constexpr char kEraseLine[] = "\x1b[K";
constexpr char kEraseBelow[] = "\x1b[J";
constexpr char kHideCursor[] = "\x1b[?25l";
constexpr char kShowCursor[] = "\x1b[?25h";

std::atomic<bool> interrupted{false};

void OnSignal(int) { interrupted.store(true); }

// A frame drawn over the last one in place: every line erased to its end, then the rest of the
// screen, so a shorter frame leaves nothing of a longer one behind (and nothing flickers).
std::string InPlace(const std::string& frame) {
  std::string out = kHome;
  for (absl::string_view line : absl::StrSplit(frame, '\n')) {
    absl::StrAppend(&out, line, kEraseLine, "\n");
  }
  if (!out.empty()) out.pop_back();
  return absl::StrCat(out, kEraseBelow);
}

// Sleeps up to `d`, waking early when interrupted.
void Nap(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (!interrupted.load() && absl::Now() < until) {
    absl::SleepFor(std::min(absl::Milliseconds(100), until - absl::Now()));
  }
}

}  // namespace

CLI::App* AddTopCommand(CLI::App& app, TopArgs* args) {
  CLI::App* top = app.add_subcommand(
      "top",
      "Live view per worker and sequence: HBM saved, T0-T3 tokens, DDR used, plans/s, degraded "
      "plans, lease age; refreshed in place (plain ANSI) until Ctrl-C");
  top->add_flag("--once", args->once, "Print one frame without escapes and exit (for scripts)");
  top->add_option("--interval", args->interval_s, "Seconds between frames")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  top->add_option("--frames", args->frames, "Stop after this many frames (0 = until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);
  top->add_flag("--json", args->json, "Each frame as one line of JSON (the daemon's status)");
  return top;
}

std::string RenderTopFrame(const v1::GetStatusResponse& status, const std::string& note) {
  const StatusView v = BuildStatusView(status);
  std::string out = "kvtierd";
  for (const auto& [label, value] : v.summary) {
    absl::StrAppend(&out, label == "version" ? " " : "  ", label == "version" ? "" : label + " ",
                    value);
  }
  absl::StrAppend(&out, "\n");
  Table pools({"POOL", "USED / CAPACITY", "SLOTS"}, /*align_numbers=*/false);
  for (const PoolView& p : v.pools) pools.AddRow({p.name, p.text, absl::StrCat(p.slots)});
  absl::StrAppend(&out, pools.Render());
  if (!v.links.empty()) {
    Table links({"LINK", "SCOPE", "NUMA", "GRANTS"}, /*align_numbers=*/false);
    for (const LinkView& l : v.links) {
      links.AddRow({l.link_id, l.scope, absl::StrCat(l.numa_node), l.text});
    }
    absl::StrAppend(&out, links.Render());
  }
  absl::StrAppend(&out, "\n");
  Table rows(std::vector<std::string>(kViewColumns.begin(), kViewColumns.end()));
  for (const ViewRow& r : v.rows) rows.AddRow(r.cells);
  absl::StrAppend(&out, rows.Render());
  if (!note.empty()) absl::StrAppend(&out, "(node totals only: ", note, ")\n");
  return out;
}

int RunTop(const TopArgs& args, const TopSource& fetch) {
  const bool tty = !args.once && !args.json && isatty(STDOUT_FILENO);
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  if (tty) std::fputs(kHideCursor, stdout);
  for (int frame = 0; !interrupted.load(); ++frame) {
    absl::StatusOr<TopFetch> got = fetch();
    if (!got.ok()) {
      if (tty) std::fputs(kShowCursor, stdout);
      std::fprintf(stderr, "kvtierctl: %s\n", std::string(got.status().message()).c_str());
      return 1;
    }
    if (args.json) {
      std::printf("%s\n", StatusJson(got->status, /*multiline=*/false).c_str());
    } else {
      const std::string text = RenderTopFrame(got->status, got->note);
      std::fputs(tty ? InPlace(text).c_str() : text.c_str(), stdout);
      if (!tty && !args.once) std::fputs("\n", stdout);  // frames apart in a log
    }
    std::fflush(stdout);
    if (args.once || (args.frames > 0 && frame + 1 >= args.frames)) break;
    Nap(absl::Seconds(args.interval_s));
  }
  if (tty) std::fputs(absl::StrCat(kShowCursor, "\n").c_str(), stdout);
  return 0;
}

}  // namespace kvtier::ctl
