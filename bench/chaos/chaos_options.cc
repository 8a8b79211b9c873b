#include "bench/chaos/chaos_options.h"

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier::testing {
namespace {

template <typename T>
void Count(CLI::App& app, const char* name, T* value, const char* what, T max) {
  app.add_option(name, *value, what)->check(CLI::Range(T{0}, max))->capture_default_str();
}

}  // namespace

absl::StatusOr<ChaosOptions> ParseChaosOptions(const std::vector<std::string>& args) {
  ChaosOptions o;
  CLI::App app{"kvtier-chaos: random faults against a real kvtierd and worker processes"};
  app.add_option("--workers", o.workers, "Worker processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  Count(app, "--kills", &o.kills, "Worker kill -9s", 100000);
  Count(app, "--stalls", &o.stalls, "Daemon SIGSTOPs past the RPC deadline", 1000);
  Count(app, "--restarts", &o.restarts, "Daemon kill -9 and restart", 100);
  Count(app, "--reloads", &o.reloads,
        "SIGHUP reloads: lease doubled with per-worker limits, then back", 1000);
  Count(app, "--lease-stalls", &o.lease_stalls, "Daemon SIGSTOPs past the lease (TTL + 500 ms)",
        100);
  Count(app, "--stuck-clients", &o.stuck_clients,
        "Clients that send requests and stop reading (raw HTTP/2), one at a time", 1000);
  Count(app, "--full-tmpfs", &o.full_tmpfs,
        "Times the pools' tmpfs (pools.extent_dir, mounted privately) fills for --full-ms", 100);
  app.add_option("--ttl-ms", o.ttl_ms, "Lease TTL")
      ->check(CLI::Range(200, 60000))
      ->capture_default_str();
  app.add_option("--unread-timeout-ms", o.unread_timeout_ms,
                 "server.unread_timeout_ms: a peer that reads nothing this long is dropped")
      ->check(CLI::Range(100, 10000))
      ->capture_default_str();
  app.add_option("--full-ms", o.full_ms, "How long the tmpfs stays full each time")
      ->check(CLI::Range(100, 60000))
      ->capture_default_str();
  app.add_option("--seed", o.seed,
                 "Random seed: the faults' order, moments and victims, and the workers' data "
                 "(printed in the report; rerun a failing run with it)")
      ->check(CLI::Validator(  // CLI11 would wrap "-3" into a uint64
          [](std::string& v) {
            return !v.empty() && v[0] == '-' ? "a seed is 0 or more, not " + v : std::string();
          },
          ""))
      ->capture_default_str();
  app.add_option("--soak", o.soak_options.seconds,
                 "Soak instead of faults: seconds of W workers x --sequences, no faults")
      ->check(CLI::Range(10, 86400));
  app.add_option("--sequences", o.soak_options.sequences, "Sequences per worker (--soak)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-rss-growth", o.soak_options.max_rss_growth,
                 "Largest daemon RSS growth after the first minute (--soak)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    o.help = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  const auto given = [&](const std::vector<const char*>& names) {
    std::vector<std::string> out;
    for (const char* n : names) {
      if (app.count(n) > 0) out.push_back(n);
    }
    return out;
  };
  o.soak = app.count("--soak") > 0;
  if (o.soak) {
    const std::vector<std::string> faults =
        given({"--kills", "--stalls", "--restarts", "--reloads", "--lease-stalls",
               "--stuck-clients", "--full-tmpfs", "--unread-timeout-ms", "--full-ms"});
    if (!faults.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--soak ", o.soak_options.seconds,
                                                     " injects no faults; drop ",
                                                     absl::StrJoin(faults, ", ")));
    }
    o.soak_options.workers = app.count("--workers") > 0 ? o.workers : 32;
    o.soak_options.seed = o.seed;
    return o;
  }
  const std::vector<std::string> soak_only = given({"--sequences", "--max-rss-growth"});
  if (!soak_only.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::StrJoin(soak_only, " and "), " need --soak"));
  }
  if (app.count("--full-ms") > 0 && o.full_tmpfs == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--full-ms ", o.full_ms, " needs --full-tmpfs of at least 1"));
  }
  if (app.count("--unread-timeout-ms") > 0 && o.stuck_clients == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--unread-timeout-ms ", o.unread_timeout_ms,
                                                   " needs --stuck-clients of at least 1"));
  }
  return o;
}

}  // namespace kvtier::testing
