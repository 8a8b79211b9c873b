#ifndef KVTIER_BENCH_CHAOS_SOAK_H_
#define KVTIER_BENCH_CHAOS_SOAK_H_

// kvtier-chaos --soak: W worker processes x M sequences tiering through one kvtierd for a given
// time, no faults. Samples the daemon's RSS, and at the end checks that RSS grew at most
// --max-rss-growth after the first minute (a tenth of the run when shorter), that the pool and
// extent accounting is back to zero once every worker closed, and that no process logged an
// error. Prints the samples and the checks as tables; exit 0 only when every check passes.

#include <cstdint>

namespace kvtier::testing {

struct SoakOptions {
  int workers = 32;
  int sequences = 8;
  int seconds = 600;
  double max_rss_growth = 0.05;
  int sample_seconds = 30;   // one table row per this many seconds
  uint64_t seed = 20261201;  // worker i's data comes from seed + i
};

int RunSoak(const SoakOptions& options);

}  // namespace kvtier::testing

#endif  // KVTIER_BENCH_CHAOS_SOAK_H_
