// CUDA VMM pools and their fallbacks through the real dlopen-by-name path, with real processes:
// kvtierd loads the fake driver library (bin/libkvtier_fake_cuda.so, tests/support/
// fake_cuda_library.cc) through pools.cuda_library, workers through ClientOptions::cuda_library,
// and KVTIER_FAKE_CUDA in a process's environment tells its driver where to fail. Workers that
// must fail differently from this test's own run as kvtier-sim-worker processes.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/sim_worker.h"
#include "tests/support/fake_cuda_driver.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
// 1 MiB extents (the fake's granularity made to match): pools grow extent by extent.
constexpr char kSmallExtents[] = "extent_mib = 1\n";
const std::string kFineGranularity = "granularity=1048576";

std::string FakeLibrary() { return BuiltProgram("libkvtier_fake_cuda.so"); }

std::string FakeEnv(const std::string& spec) { return absl::StrCat("KVTIER_FAKE_CUDA=", spec); }

// kvtierd's config: the pools' backend and the fake as its driver, after `extra` [pools] keys.
std::string PoolsConfig(const std::string& backend, const std::string& extra = "") {
  return absl::StrCat(extra, "backend = \"", backend, "\"\ncuda_library = \"", FakeLibrary(),
                      "\"\n");
}

struct Daemon {
  std::unique_ptr<DaemonProcess> process;
  int metrics_port = 0;
};

// Starts kvtierd with the fake (configured by `fake_spec`) and a metrics endpoint.
Daemon StartDaemon(const std::string& backend, const std::string& fake_spec,
                   const std::string& extra = kSmallExtents) {
  Daemon d;
  absl::StatusOr<int> port = FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status();
  if (!port.ok()) return d;
  d.metrics_port = *port;
  auto started = DaemonProcess::Start({.config_text = PoolsConfig(backend, extra),
                                       .env = {FakeEnv(fake_spec)},
                                       .metrics_address = absl::StrCat("127.0.0.1:", *port)});
  EXPECT_TRUE(started.ok()) << started.status();
  if (started.ok()) d.process = *std::move(started);
  return d;
}

// A worker in this process over the fake, which fails nowhere here.
std::unique_ptr<SimWorker> LocalWorker(const DaemonProcess& daemon, uint64_t seed,
                                       double gamma = 0.2) {
  SimWorkerOptions o{.address = daemon.address(), .seed = seed, .cuda_library = FakeLibrary()};
  o.t1_page_bytes = 32768;
  o.policy.set_name("hierarchy");
  o.policy.set_hbm_ratio(0.5);
  o.policy.set_evict_ratio(0.05);
  o.policy.set_compress_ratio(gamma);
  o.policy.set_protect_prompt(true);
  auto w = SimWorker::Connect(o);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

// Runs kvtier-sim-worker against `daemon` with its fake configured by `fake_spec`.
RunResult RunWorkerProcess(const DaemonProcess& daemon, const std::string& fake_spec,
                           std::vector<std::string> flags) {
  std::vector<std::string> argv = {BuiltProgram("kvtier-sim-worker"),
                                   "--address=" + daemon.address(),
                                   "--cuda_library=" + FakeLibrary()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunProgram(argv, absl::Seconds(60), {FakeEnv(fake_spec)});
}

// The value of a "key=value" line of `output` ("" when there is none).
std::string Value(const std::string& output, const std::string& key) {
  const std::string needle = "\n" + key + "=";
  const size_t at = ("\n" + output).find(needle);
  if (at == std::string::npos) return "";
  const size_t from = at + needle.size() - 1;
  return output.substr(from, output.find('\n', from) - from);
}

double Metric(const Daemon& d, const std::string& name) {
  return ScrapeMetric(d.metrics_port, name);
}

// What backs `address` in this process: the path /proc/self/maps names ("" when unmapped).
std::string MappedFile(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    unsigned long from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &from, &to) != 2 || a < from || a >= to) continue;
    const size_t slash = line.find('/');
    return slash == std::string::npos ? "[anonymous]" : line.substr(slash);
  }
  return "";
}

// RunProgram over kvtierd with a config file of [pools] `pools` and the fake's `fake_spec`.
RunResult RunKvtierd(const std::string& pools, const std::string& fake_spec) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/vmm-fallback-", getpid());
  std::ofstream(base + ".toml") << "[pools]\nddr_mib = 64\ncompressed_mib = 32\n" << pools;
  RunResult r = RunProgram({BuiltProgram("kvtierd"), "--config", base + ".toml", "--socket",
                            base + ".sock", "--metrics", ""},
                           absl::Seconds(30), {FakeEnv(fake_spec)});
  std::remove((base + ".toml").c_str());
  return r;
}

uint32_t Mapped(SimWorker& w, v1::PoolKind kind) { return w.client().pool(kind)->mapped_extents(); }

// Checks which of `w`'s pools are CUDA VMM (as kvtierd served them: no fallback of the worker's
// own), then tiers a new sequence for `steps` steps, every page verified after every plan. Call
// under ASSERT_NO_FATAL_FAILURE.
void TierOverPools(SimWorker& w, bool ddr_vmm, bool compressed_vmm, int steps) {
  EXPECT_EQ(w.client().pool(v1::POOL_KIND_DDR)->device_mapped(), ddr_vmm);
  EXPECT_EQ(w.client().pool(v1::POOL_KIND_COMPRESSED)->device_mapped(), compressed_vmm);
  EXPECT_EQ(w.client().pool_fallback_reason(), "");
  auto seq = w.Open();
  ASSERT_TRUE(seq.ok()) << seq.status();
  for (int step = 0; step < steps; ++step) ASSERT_TRUE(w.Step(*seq, 256).ok()) << step;
  EXPECT_GT(w.stats().moves, 0u);
  EXPECT_GT(w.stats().verified_pages, 0u);  // read back through the mapping after every plan
}

// (a) A driver on both sides: "auto" makes both pools CUDA VMM, the worker imports and maps its
// extents for the device and the host, the bytes it writes are in kvtierd's allocations, and
// kvtierd's figures count exactly the extents the worker mapped.
TEST(CudaVmmFallbackTest, AutoWithADriverServesCudaVmmPoolsThatAWorkerMapsForTheDevice) {
  Daemon d = StartDaemon("auto", kFineGranularity);
  ASSERT_NE(d.process, nullptr);
  ASSERT_TRUE(d.process->WaitForLog(
      "DDR CUDA VMM pinned on host NUMA node 0 (driver 13000); compressed CUDA VMM"))
      << d.process->Log();
  auto w = LocalWorker(*d.process, 1);
  ASSERT_NE(w, nullptr);
  ASSERT_NO_FATAL_FAILURE(TierOverPools(*w, true, true, 8));
  const uint32_t ddr = Mapped(*w, v1::POOL_KIND_DDR), cmp = Mapped(*w, v1::POOL_KIND_COMPRESSED);
  ASSERT_GT(ddr, 1u);  // the pool grew after registration
  ASSERT_GT(cmp, 0u);

  // This process's driver holds one mapping per extent and one range per pool, no handle.
  EXPECT_EQ(LiveInLoadedFakeLibrary(FakeLibrary()),
            (std::vector<int>{0, static_cast<int>(ddr + cmp), 2}));
  // The daemon: exactly those extents, and the granted slots' bytes.
  EXPECT_EQ(Metric(d, "kvtier_pool_reserved_bytes{tier=\"T1\"}"), ddr * kMiB);
  EXPECT_EQ(Metric(d, "kvtier_pool_reserved_bytes{tier=\"T2\"}"), cmp * kMiB);
  auto status = w->client().GetStatus(true, false);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->worker_list_size(), 1);
  EXPECT_GT(status->worker_list(0).ddr_bytes(), 0u);
  for (const v1::PoolStatus& p : status->pools()) {
    EXPECT_EQ(p.used_bytes(), p.kind() == v1::POOL_KIND_DDR
                                  ? status->worker_list(0).ddr_bytes()
                                  : status->worker_list(0).compressed_bytes());
    EXPECT_EQ(Metric(d, absl::StrCat("kvtier_pool_used_bytes{tier=\"",
                                     p.kind() == v1::POOL_KIND_DDR ? "T1" : "T2", "\"}")),
              p.used_bytes());
  }
  // What the worker wrote and read back lies in the allocations kvtierd's driver made
  // (memfd:fake-cuda, received over the channel), not in memory of its own.
  EXPECT_EQ(MappedFile(w->client().pool(v1::POOL_KIND_DDR)->data()).rfind("/memfd:fake-cuda", 0),
            0u);
  EXPECT_EQ(
      MappedFile(w->client().pool(v1::POOL_KIND_COMPRESSED)->data()).rfind("/memfd:fake-cuda", 0),
      0u);
}

// (b) A worker whose own driver refuses the pools at registration registers again with memfd
// pools, says why (the step or the check, and the driver's error) and tiers as usual: its driver
// cannot reserve the pools' ranges, or it is older than 12.2 while the daemon's is recent (another
// library, an older one in the worker's container).
struct RegistrationFallback {
  std::string fake_spec;
  std::string reason_prefix;
  std::string reason_part;
};

class RegistrationFallbackTest : public ::testing::TestWithParam<RegistrationFallback> {};

TEST_P(RegistrationFallbackTest, AWorkerWhoseDriverRefusesThePoolsFallsBackToMemfd) {
  const RegistrationFallback& c = GetParam();
  Daemon d = StartDaemon("cuda_vmm", kFineGranularity);
  ASSERT_NE(d.process, nullptr);
  RunResult r = RunWorkerProcess(*d.process, c.fake_spec, {"--steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("registered ddr_device_mapped=0 compressed_device_mapped=0"),
            std::string::npos)
      << r.output;
  const std::string reason = Value(r.output, "fallback_reason");
  EXPECT_EQ(reason.rfind("DDR pool is CUDA VMM memory: " + c.reason_prefix, 0), 0u) << r.output;
  EXPECT_NE(reason.find(c.reason_part), std::string::npos) << reason;
  EXPECT_EQ(Value(r.output, "steps_ok"), "6") << r.output;
  EXPECT_EQ(Value(r.output, "fallback_step"), "0") << r.output;
  EXPECT_EQ(Value(r.output, "fake_live"), "0,0,0") << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    ReserveOrVersion, RegistrationFallbackTest,
    ::testing::Values(RegistrationFallback{"cuMemAddressReserve", "cuMemAddressReserve(",
                                           "injected failure (CUresult 999)"},
                      RegistrationFallback{"version=12010",
                                           "CUDA driver 12.1 (12010) is older than 12.2 (12020)",
                                           ", the first with host-NUMA VMM allocations"}));

// (b) A worker whose GPU cannot import any of the daemon's handles: the first plan that grants
// an extent fails naming the import, the worker registers again with memfd pools and goes on.
TEST(CudaVmmFallbackTest, AWorkerThatCannotImportFallsBackAtItsFirstExtent) {
  Daemon d = StartDaemon("cuda_vmm", kFineGranularity);
  ASSERT_NE(d.process, nullptr);
  RunResult r = RunWorkerProcess(*d.process, "cuMemImportFromShareableHandle", {"--steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("registered ddr_device_mapped=1 compressed_device_mapped=1"),
            std::string::npos)
      << r.output;
  const std::string reason = Value(r.output, "fallback_reason");
  EXPECT_NE(reason.find("extent 0: cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR): "
                        "injected failure"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("registered again with memfd pools"), std::string::npos) << r.output;
  EXPECT_EQ(Value(r.output, "vmm_extents_before_fallback"), "0") << r.output;
  EXPECT_EQ(Value(r.output, "ddr_device_mapped"), "0");
  EXPECT_EQ(Value(r.output, "steps_ok"), "5") << r.output;  // all but the one that fell back
  EXPECT_EQ(Value(r.output, "fake_live"), "0,0,0") << r.output;
}

// (b') Heartbeats racing the fallback: they find the old session closed while the plan that
// failed registers again, and the threads open one new session between them, not one each (an
// extra one would outlive the worker until its lease ran out).
TEST(CudaVmmFallbackTest, HeartbeatsRacingAFallbackOpenOneNewSessionBetweenThem) {
  Daemon d = StartDaemon("cuda_vmm", kFineGranularity);
  ASSERT_NE(d.process, nullptr);
  for (int run = 0; run < 3; ++run) {
    RunResult r = RunWorkerProcess(*d.process, "cuMemImportFromShareableHandle",
                                   {"--steps=6", "--heartbeat_threads=3"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("registered again with memfd pools"), std::string::npos) << r.output;
    EXPECT_EQ(Value(r.output, "steps_ok"), "5") << r.output;
  }
  auto observer = LocalWorker(*d.process, 11);
  ASSERT_NE(observer, nullptr);
  auto status = observer->client().GetStatus(true, false);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->workers(), 1u);  // the observer alone: every worker closed its one session
  for (const v1::PoolStatus& p : status->pools()) EXPECT_EQ(p.used_bytes(), 0u) << p.kind();
}

// (c) Plan time: the worker imported and used its first extent; a later plan grows the DDR pool
// and the import (or the map, or the access grant) of the new extent fails. The plan is refused,
// the worker falls back to memfd pools (a new session) and tiers on; the daemon keeps serving
// another CUDA VMM worker before and after, and once the failed worker is gone the daemon's
// accounting holds only the other worker's memory.
class PlanTimeFallbackTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PlanTimeFallbackTest, AStepFailingForAnExtentGrantedLaterFallsBackAndLeaksNothing) {
  const std::string failing = GetParam();
  const std::string reason = absl::StrCat("DDR pool extent 1: ", failing);
  Daemon d = StartDaemon("cuda_vmm", kFineGranularity);
  ASSERT_NE(d.process, nullptr);
  auto other = LocalWorker(*d.process, 7);
  ASSERT_NE(other, nullptr);
  auto seq = other->Open();
  ASSERT_TRUE(seq.ok()) << seq.status();
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(other->Step(*seq, 256).ok());

  // No T2 (gamma 0): only the DDR pool grows, so the second call is for the DDR pool's extent 1.
  RunResult r = RunWorkerProcess(*d.process, failing + ":after=1", {"--steps=12", "--gamma=0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int fallback_step = std::atoi(Value(r.output, "fallback_step").c_str());
  EXPECT_GT(fallback_step, 1) << r.output;  // earlier plans ran over the imported extent
  EXPECT_EQ(Value(r.output, "vmm_extents_before_fallback"), "1") << r.output;
  EXPECT_EQ(Value(r.output, "fallback_reason").rfind(reason, 0), 0u) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("step ", fallback_step, " error=", reason)),
            std::string::npos)
      << r.output;
  EXPECT_EQ(Value(r.output, "steps_ok"), "11") << r.output;
  EXPECT_EQ(Value(r.output, "ddr_device_mapped"), "0");
  // The failed worker's driver: the range of the abandoned pools was unmapped and freed.
  EXPECT_EQ(Value(r.output, "fake_live"), "0,0,0") << r.output;
  EXPECT_EQ(Value(r.output, "fake_live_after_close"), "0,0,0") << r.output;

  // The daemon lives and serves the other worker, whose pages kept their bytes.
  ASSERT_EQ(kill(d.process->pid(), 0), 0);
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(other->Step(*seq, 256).ok());
  EXPECT_TRUE(other->client().pool(v1::POOL_KIND_DDR)->device_mapped());
  auto status = other->client().GetStatus(true, true);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->workers(), 1u);
  EXPECT_EQ(status->sequences(), 1u);
  ASSERT_EQ(status->worker_list_size(), 1);
  EXPECT_EQ(status->worker_list(0).worker_id(), other->client().worker_id());
  for (const v1::PoolStatus& p : status->pools()) {
    const bool ddr = p.kind() == v1::POOL_KIND_DDR;
    EXPECT_EQ(p.used_bytes(),
              ddr ? status->worker_list(0).ddr_bytes() : status->worker_list(0).compressed_bytes());
    EXPECT_EQ(
        Metric(d, absl::StrCat("kvtier_pool_reserved_bytes{tier=\"", ddr ? "T1" : "T2", "\"}")),
        Mapped(*other, p.kind()) * kMiB);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryWorkerStep, PlanTimeFallbackTest,
                         ::testing::Values("cuMemImportFromShareableHandle", "cuMemMap",
                                           "cuMemSetAccess"));

// (d) A driver older than 12.2: "cuda_vmm" refuses to start naming both versions; "auto" serves
// memfd pools and says why in its log.
TEST(CudaVmmFallbackTest, ADriverTooOldIsRefusedByCudaVmmAndAutoFallsBackToMemfd) {
  RunResult refused = RunKvtierd(PoolsConfig("cuda_vmm"), "version=12010");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("pools.backend = \"cuda_vmm\": CUDA driver 12.1 (12010) is older "
                                "than 12.2 (12020)"),
            std::string::npos)
      << refused.output;

  Daemon d = StartDaemon("auto", "version=12010");
  ASSERT_NE(d.process, nullptr);
  EXPECT_TRUE(d.process->WaitForLog(
      "DDR memfd (CUDA driver 12.1 (12010) is older than 12.2 (12020), the first with host-NUMA "
      "VMM allocations)"))
      << d.process->Log();
  auto w = LocalWorker(*d.process, 2);
  ASSERT_NE(w, nullptr);
  ASSERT_NO_FATAL_FAILURE(TierOverPools(*w, false, false, 4));  // memfd was what kvtierd served
}

// (e) The host cannot pin a DDR extent (cuMemCreate out of memory for 4 MiB): "cuda_vmm" refuses
// naming the pool; "auto" keeps the DDR pool memfd and the compressed pool CUDA VMM, and a worker
// maps each as it is.
TEST(CudaVmmFallbackTest, APoolTheHostCannotPinIsRefusedByCudaVmmAndMemfdUnderAuto) {
  // DDR extents of 4 MiB, compressed of 2 MiB (a sixteenth of 32 MiB); only the larger fail.
  const std::string extents = "extent_mib = 4\n";
  const std::string pin_limit = "cuMemCreate:oom:above=2097152";
  RunResult refused = RunKvtierd(PoolsConfig("cuda_vmm", extents), pin_limit);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("pools.backend = \"cuda_vmm\": DDR pool: cuMemCreate(4 MiB pinned "
                                "on host NUMA node 0): out of memory (CUresult 2)"),
            std::string::npos)
      << refused.output;

  Daemon d = StartDaemon("auto", pin_limit, extents);
  ASSERT_NE(d.process, nullptr);
  EXPECT_TRUE(d.process->WaitForLog(
      "DDR memfd (cuMemCreate(4 MiB pinned on host NUMA node 0): out of memory (CUresult 2)); "
      "compressed CUDA VMM pinned on host NUMA node 0"))
      << d.process->Log();
  auto w = LocalWorker(*d.process, 3);
  ASSERT_NE(w, nullptr);
  ASSERT_NO_FATAL_FAILURE(TierOverPools(*w, false, true, 8));
  EXPECT_GT(Mapped(*w, v1::POOL_KIND_DDR), 0u);
  EXPECT_GT(Mapped(*w, v1::POOL_KIND_COMPRESSED), 0u);  // T2 pages in imported memory
  EXPECT_EQ(LiveInLoadedFakeLibrary(FakeLibrary()),
            (std::vector<int>{0, static_cast<int>(Mapped(*w, v1::POOL_KIND_COMPRESSED)), 1}));
}

// A bad KVTIER_FAKE_CUDA is an error at cuInit naming the item, not a driver that half works.
TEST(CudaVmmFallbackTest, ABadFakeConfigurationFailsCuInitNamingTheItem) {
  RunResult r = RunKvtierd(PoolsConfig("cuda_vmm"), "cuMemImport:after=1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cuInit: KVTIER_FAKE_CUDA: item \"cuMemImport:after=1\" names no entry "
                          "point"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace kvtier::testing
