#ifndef KVTIER_CLIENT_KVTIERCTL_PLAN_COMMAND_H_
#define KVTIER_CLIENT_KVTIERCTL_PLAN_COMMAND_H_

// `kvtierctl plan`: the capacity planner (core/planning/capacity.h) for an operator. It talks to
// no daemon: it reads the model's geometry and this host's /proc/meminfo.

#include <CLI/CLI.hpp>
#include <map>
#include <string>

namespace kvtier::ctl {

struct PlanArgs {
  std::map<std::string, std::string> values;  // option name -> its text, parsed by RunPlan
  bool no_protect_prompt = false;
  bool json = false;
};

// Registers the `plan` subcommand on `app`; its options fill `args`.
CLI::App* AddPlanCommand(CLI::App& app, PlanArgs* args);

// Prints the plan (a table, or JSON). Exit status: 0, or 2 for bad input, with a message on
// stderr naming the option or file, the value and the limit.
int RunPlan(const PlanArgs& args);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_PLAN_COMMAND_H_
