#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_SIM_WORKER_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_SIM_WORKER_H_

// A worker without a model, for daemon tests: it grows sequences, sends snapshots with random
// scores, executes plans against the real shared-memory pools (writing a per-page pattern into
// every granted slot) and checks after every plan that each offloaded page still holds exactly
// the bytes it wrote — so a slot granted twice, freed early or overlapping another worker's
// shows up as corrupted data. Not thread-safe; one per process or thread.

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/client.h"

namespace kvtier::testing {

struct SimWorkerOptions {
  std::string address;
  std::string name = "sim";
  uint32_t page_tokens = 16;
  uint32_t t1_page_bytes = 16384;  // small pages: many fit in a test pool
  uint32_t t2_page_bytes = 4608;
  v1::PolicyConfig policy;  // default: hierarchy, beta 0.5, r 0.05, gamma 0.2
  uint64_t prompt_tokens = 64;
  uint64_t seed = 1;
  bool background_heartbeat = true;
  bool heartbeat_over_channel = true;  // ClientOptions::heartbeat_over_channel
  // RegisterWorkerRequest.pool_memory (CUDA_VMM: no silent memfd fallback).
  v1::PoolMemory pool_memory = v1::POOL_MEMORY_UNSPECIFIED;
  std::string cuda_library = "libcuda.so.1";  // ClientOptions::cuda_library
  // Snapshots carry SubmitSnapshotRequest.lost_mass: the score share of the T2 pages (times a
  // codec error of 0.05) and of the evicted ones, as the sequence stood before the snapshot.
  bool report_lost_mass = false;
};

struct SimStats {
  uint64_t plans = 0;
  uint64_t moves = 0;
  uint64_t degraded = 0;
  std::string degraded_reason;  // of the last degraded plan
  uint64_t verified_pages = 0;
};

class SimWorker {
 public:
  static absl::StatusOr<std::unique_ptr<SimWorker>> Connect(const SimWorkerOptions& options);

  // Opens a sequence; returns its index in this worker.
  absl::StatusOr<int> Open();
  // Grows sequence `i` by `tokens`, submits a snapshot, executes and acknowledges the plan,
  // then verifies every page's bytes and the plan's invariants (protected pages in T0; evicted
  // set only grows). Any violation is an INTERNAL error describing it.
  absl::Status Step(int i, uint64_t tokens);
  absl::Status Close(int i);
  // Drops sequence `i` locally without telling the daemon (it forgot it in a restart).
  void Forget(int i) { sequences_.erase(i); }
  WorkerClient& client() { return *client_; }
  // The daemon's id of sequence `i` (0 when there is none).
  uint64_t sequence_id(int i) const {
    auto it = sequences_.find(i);
    return it == sequences_.end() ? 0 : it->second.id;
  }
  const SimStats& stats() const { return stats_; }
  size_t open_sequences() const { return sequences_.size(); }

 private:
  struct Page {
    uint8_t tier = 0;
    uint64_t slot = 0;
    uint32_t stamp = 0;  // pattern seed of the bytes written into the slot
  };
  struct Sequence {
    uint64_t id = 0;
    uint64_t length = 0;
    uint64_t acked_version = 0;
    std::vector<Page> pages;
    std::vector<float> scores;
  };
  explicit SimWorker(SimWorkerOptions options)
      : options_(std::move(options)), rng_(options_.seed) {}
  absl::Status Verify(const Sequence& s) const;
  void Fill(uint8_t tier, uint64_t slot, uint32_t stamp);
  bool Check(uint8_t tier, uint64_t slot, uint32_t stamp) const;
  uint64_t SlotBytes(uint8_t tier) const;

  SimWorkerOptions options_;
  std::unique_ptr<WorkerClient> client_;
  std::map<int, Sequence> sequences_;
  int next_ = 0;
  uint32_t next_stamp_ = 1;
  std::mt19937_64 rng_;
  SimStats stats_;
};

// What a worker process (RunSimWorkerProcess) reports after each verified step: its worker id
// then, and counts over its whole life. Written whole (smaller than PIPE_BUF).
struct SimProgress {
  uint64_t worker_id = 0;
  uint64_t steps = 0;
  uint64_t cannot_grow = 0;  // plans degraded because the system refused to grow a pool
  uint64_t grown = 0;        // plans after which the worker had mapped more pool extents
};

// The exit code of a worker process whose pages lost their bytes.
inline constexpr int kSimCorrupted = 3;

// A worker process's life, for fault tests: connects, opens two sequences and tiers them with
// random steps; whenever the daemon forgets it or goes away it starts over with a fresh
// registration. After every verified step it writes a SimProgress to `progress_fd` (-1: none).
// Exits kSimCorrupted when a page's bytes changed. Never returns; call it in a child forked
// before the parent touched gRPC.
[[noreturn]] void RunSimWorkerProcess(const std::string& address, uint64_t seed,
                                      int progress_fd = -1);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_SIM_WORKER_H_
