// The fuzz target's body without libFuzzer: seeded inputs, each mutated from the best one so
// far (fitness: how many snapshots and acks got past validation), so the search reaches the
// plan paths that uniform random bytes almost never do. Every request-handling path it reaches
// must keep the core's invariants (the target aborts, failing this test, when one breaks).

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" void KvtierFuzzSuccesses(uint64_t out[6]);

namespace {

std::array<uint64_t, 6> Successes() {
  std::array<uint64_t, 6> ok;
  KvtierFuzzSuccesses(ok.data());
  return ok;
}

TEST(DaemonCoreFuzzReplay, MutatedInputsKeepTheInvariants) {
  std::mt19937_64 rng(20261129);
  std::vector<uint8_t> best(512);
  for (uint8_t& b : best) b = static_cast<uint8_t>(rng());
  uint64_t best_fitness = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> input = best;
    for (int k = 1 + static_cast<int>(rng() % 8); k > 0; --k) {
      input[rng() % input.size()] = static_cast<uint8_t>(rng());
    }
    if (rng() % 4 == 0) input.resize(64 + rng() % 1024, static_cast<uint8_t>(rng()));
    const auto before = Successes();
    ASSERT_EQ(LLVMFuzzerTestOneInput(input.data(), input.size()), 0);
    const auto after = Successes();
    const uint64_t fitness =
        (after[2] - before[2]) + 4 * (after[3] - before[3]) + 4 * (after[4] - before[4]);
    if (fitness >= best_fitness) {
      best_fitness = fitness;
      best = std::move(input);
    }
  }
  // The inputs must reach past validation, or the invariants were never at risk.
  const auto ok = Successes();
  const char* names[] = {"register", "heartbeat", "open", "snapshot", "ack", "close"};
  for (int i = 0; i < 6; ++i) {
    std::printf("%s: %lu accepted\n", names[i], static_cast<unsigned long>(ok[i]));
    EXPECT_GT(ok[i], 100u) << names[i];
  }
}

}  // namespace
