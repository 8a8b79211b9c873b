#ifndef KVTIER_CLIENT_KVTIERCTL_TOP_COMMAND_H_
#define KVTIER_CLIENT_KVTIERCTL_TOP_COMMAND_H_

// `kvtierctl top`: the live view of a daemon (client/kvtierctl/status_view.h), refreshed in place
// with plain ANSI escapes (no curses) on a terminal, or printed once (`--once`) for scripts.

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::ctl {

struct TopArgs {
  bool once = false;
  double interval_s = 2.0;
  int frames = 0;  // stop after this many frames; 0 = until interrupted
  bool json = false;
};

// Registers the `top` subcommand on `app`; its options fill `args`.
CLI::App* AddTopCommand(CLI::App& app, TopArgs* args);

// One frame: node totals, pools, links, then a row per worker and one per sequence beneath it.
// `note`: why the lists are empty, when they are ("" = nothing to say).
std::string RenderTopFrame(const v1::GetStatusResponse& status, const std::string& note);

// What a frame shows: the daemon's status with every worker and sequence this caller may see,
// and a note saying why they are not listed, when they are not.
struct TopFetch {
  v1::GetStatusResponse status;
  std::string note;
};
using TopSource = std::function<absl::StatusOr<TopFetch>()>;

// Runs the view until interrupted (SIGINT, SIGTERM), `args.frames` frames or, with `once`, one.
// Exit status: 0, or 1 when the daemon cannot be reached (the message on stderr).
int RunTop(const TopArgs& args, const TopSource& fetch);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_TOP_COMMAND_H_
