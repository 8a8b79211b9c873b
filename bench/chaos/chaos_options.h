#ifndef KVTIER_BENCH_CHAOS_CHAOS_OPTIONS_H_
#define KVTIER_BENCH_CHAOS_CHAOS_OPTIONS_H_

// kvtier-chaos's command line: the faults to inject and how many, or a soak. Every count and
// duration is range-checked, and options that contradict each other are refused, each with an
// INVALID_ARGUMENT that names the option and the value. Stateless; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/chaos/soak.h"

namespace kvtier::testing {

struct ChaosOptions {
  int workers = 6;
  int kills = 20;               // worker kill -9s
  int stalls = 2;               // daemon SIGSTOPs past the RPC deadline, within the lease
  int restarts = 1;             // daemon kill -9s and restarts
  int reloads = 0;              // SIGHUPs alternating a tight config and the starting one
  int lease_stalls = 0;         // daemon SIGSTOPs past the lease
  int stuck_clients = 0;        // clients that send requests and stop reading
  int full_tmpfs = 0;           // times the pools' tmpfs fills up for a while
  int ttl_ms = 1000;            // lease TTL
  int unread_timeout_ms = 500;  // server.unread_timeout_ms
  int full_ms = 1500;           // how long the tmpfs stays full each time
  uint64_t seed = 20261201;     // the faults' order, moments and victims; the workers' data
  bool soak = false;            // --soak given: `soak_options` apply, no faults
  SoakOptions soak_options;
  std::string help;  // non-empty: --help was asked for; print it and exit 0
};

// Parses `args` (without the program name).
absl::StatusOr<ChaosOptions> ParseChaosOptions(const std::vector<std::string>& args);

}  // namespace kvtier::testing

#endif  // KVTIER_BENCH_CHAOS_CHAOS_OPTIONS_H_
