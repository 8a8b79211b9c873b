// kvtier-sim-worker: one SimWorker as a process of its own, for tests whose worker must load a
// driver configured differently from the test's (KVTIER_FAKE_CUDA in its environment). It
// registers, tiers one sequence for --steps steps and prints what happened as "key=value" lines;
// a step that fails because the worker fell back to memfd pools (a new session) is reported and
// tiering goes on in a fresh sequence.
//
//   kvtier-sim-worker --address=unix:PATH [--cuda_library=LIB] [--steps=N] [--tokens=T]
//                     [--gamma=G] [--seed=S] [--heartbeat_threads=N]
//
// --heartbeat_threads: N threads send heartbeats back to back while the worker tiers, so a
// fallback races them.
//
// Lines: "registered ddr_device_mapped=0|1 compressed_device_mapped=0|1", "step K error=...",
// then steps_ok, fallback_step (0 = none), vmm_extents_before_fallback, ddr_device_mapped,
// compressed_device_mapped, fallback_reason, fake_live (handles,mappings,reservations of
// libkvtier_fake_cuda.so while the worker lives; "none" for another library) and
// fake_live_after_close. Exit 0; 2 when it cannot register; 3 (kSimCorrupted) when a page lost
// its bytes; 4 when a step failed otherwise.

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/integration/support/sim_worker.h"
#include "tests/support/fake_cuda_driver.h"

namespace kvtier::testing {
namespace {

struct Flags {
  SimWorkerOptions worker;
  int steps = 8;
  uint64_t tokens = 256;
  int heartbeat_threads = 0;
};

bool Parse(int argc, char** argv, Flags* f) {
  double gamma = 0.2;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    bool ok = true;
    if (absl::ConsumePrefix(&a, "--address=")) {
      f->worker.address = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--cuda_library=")) {
      f->worker.cuda_library = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--steps=")) {
      ok = absl::SimpleAtoi(a, &f->steps);
    } else if (absl::ConsumePrefix(&a, "--tokens=")) {
      ok = absl::SimpleAtoi(a, &f->tokens);
    } else if (absl::ConsumePrefix(&a, "--gamma=")) {
      ok = absl::SimpleAtod(a, &gamma);
    } else if (absl::ConsumePrefix(&a, "--heartbeat_threads=")) {
      ok = absl::SimpleAtoi(a, &f->heartbeat_threads) && f->heartbeat_threads >= 0;
    } else if (absl::ConsumePrefix(&a, "--seed=")) {
      ok = absl::SimpleAtoi(a, &f->worker.seed);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "kvtier-sim-worker: bad argument %s\n", argv[i]);
      return false;
    }
  }
  v1::PolicyConfig& p = f->worker.policy;
  p.set_name("hierarchy");
  p.set_hbm_ratio(0.5);
  p.set_evict_ratio(0.05);
  p.set_compress_ratio(gamma);
  p.set_protect_prompt(true);
  f->worker.t1_page_bytes = 32768;  // 32 slots per 1 MiB extent: the pools grow step by step
  return !f->worker.address.empty();
}

// The fake driver's live objects in this process, if that is the library the worker loaded.
std::string FakeLive(const std::string& library) {
  const std::vector<int> live = LiveInLoadedFakeLibrary(library);
  return live.empty() ? "none" : absl::StrCat(live[0], ",", live[1], ",", live[2]);
}

uint32_t VmmExtents(WorkerClient& client) {
  uint32_t n = 0;
  for (v1::PoolKind kind : {v1::POOL_KIND_DDR, v1::POOL_KIND_COMPRESSED}) {
    std::shared_ptr<PoolMapping> pool = client.pool(kind);
    if (pool->device_mapped()) n += pool->mapped_extents();
  }
  return n;
}

// Threads sending heartbeats back to back until destroyed.
class Heartbeats {
 public:
  Heartbeats(WorkerClient& client, int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, &client] {
        while (!stop_.load()) (void)client.HeartbeatOnce();
      });
    }
  }
  ~Heartbeats() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

int Run(const Flags& f) {
  // Held open across the worker's life, so the counts after close are the same instance's.
  void* keep = dlopen(f.worker.cuda_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  auto w = SimWorker::Connect(f.worker);
  if (!w.ok()) {
    std::printf("connect error=%s\n", std::string(w.status().message()).c_str());
    return 2;
  }
  WorkerClient& client = (*w)->client();
  std::printf("registered ddr_device_mapped=%d compressed_device_mapped=%d\n",
              client.pool(v1::POOL_KIND_DDR)->device_mapped(),
              client.pool(v1::POOL_KIND_COMPRESSED)->device_mapped());
  std::optional<Heartbeats> heartbeats(std::in_place, client, f.heartbeat_threads);
  absl::StatusOr<int> seq = (*w)->Open();
  int steps_ok = 0, fallback_step = 0;
  uint32_t vmm_before = 0;
  for (int step = 1; seq.ok() && step <= f.steps; ++step) {
    const uint64_t generation = client.generation();
    const uint32_t vmm = VmmExtents(client);
    absl::Status s = (*w)->Step(*seq, f.tokens);
    if (s.ok()) {
      ++steps_ok;
      continue;
    }
    std::printf("step %d error=%s\n", step, std::string(s.message()).c_str());
    if (s.code() == absl::StatusCode::kInternal) return kSimCorrupted;
    if (client.generation() == generation) return 4;
    if (fallback_step == 0) {
      fallback_step = step;
      vmm_before = vmm;
    }
    (*w)->Forget(*seq);  // the old session and its sequence are gone
    seq = (*w)->Open();
  }
  heartbeats.reset();
  if (!seq.ok()) {
    std::printf("open error=%s\n", std::string(seq.status().message()).c_str());
    return 4;
  }
  std::printf("steps_ok=%d\nfallback_step=%d\nvmm_extents_before_fallback=%u\n", steps_ok,
              fallback_step, vmm_before);
  std::printf("ddr_device_mapped=%d\ncompressed_device_mapped=%d\nfallback_reason=%s\n",
              client.pool(v1::POOL_KIND_DDR)->device_mapped(),
              client.pool(v1::POOL_KIND_COMPRESSED)->device_mapped(),
              client.pool_fallback_reason().c_str());
  std::printf("fake_live=%s\n", FakeLive(f.worker.cuda_library).c_str());
  w->reset();
  std::printf("fake_live_after_close=%s\n", FakeLive(f.worker.cuda_library).c_str());
  if (keep != nullptr) dlclose(keep);
  return 0;
}

}  // namespace
}  // namespace kvtier::testing

int main(int argc, char** argv) {
  kvtier::testing::Flags flags;
  if (!kvtier::testing::Parse(argc, argv, &flags)) return 1;
  const int code = kvtier::testing::Run(flags);
  std::fflush(stdout);
  return code;
}
