// pools.backend on a host without a CUDA driver (this machine): "cuda_vmm" refuses to start and
// says why; "auto" (the default) serves memfd pools as before and says so in its log. On a host
// with a driver the first test skips (tests/gpu covers it there).

#include <dlfcn.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

bool HostHasCudaDriver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) dlclose(lib);
  return lib != nullptr;
}

TEST(PoolBackendTest, CudaVmmWithoutADriverRefusesToStartSayingWhy) {
  if (HostHasCudaDriver()) GTEST_SKIP() << "this host has a CUDA driver";
  const std::string dir = ::testing::TempDir();
  const std::string config = dir + "/vmm.toml";
  std::ofstream(config) << "[pools]\nddr_mib = 64\ncompressed_mib = 32\nbackend = \"cuda_vmm\"\n";
  RunResult r = RunProgram({BuiltProgram("kvtierd"), "--config", config, "--socket",
                            dir + "/vmm.sock", "--metrics", ""});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pools.backend = \"cuda_vmm\": no CUDA driver: libcuda.so.1"),
            std::string::npos)
      << r.output;
}

TEST(PoolBackendTest, AutoServesMemfdPoolsAndLogsWhich) {
  auto daemon = DaemonProcess::Start({});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_TRUE((*daemon)->WaitForLog("pools (pools.backend = \"auto\"): DDR "));
  if (!HostHasCudaDriver()) {
    EXPECT_NE((*daemon)->Log().find("DDR memfd (no CUDA driver"), std::string::npos)
        << (*daemon)->Log();
  }
  auto worker = SimWorker::Connect({.address = (*daemon)->address()});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto seq = (*worker)->Open();
  ASSERT_TRUE(seq.ok()) << seq.status();
  for (int step = 0; step < 4; ++step) ASSERT_TRUE((*worker)->Step(*seq, 256).ok());
  EXPECT_GT((*worker)->stats().verified_pages, 0u);
  if (!HostHasCudaDriver()) {
    EXPECT_FALSE((*worker)->client().pool(v1::POOL_KIND_DDR)->device_mapped());
    EXPECT_EQ((*worker)->client().pool_fallback_reason(), "");
  }
}

}  // namespace
}  // namespace kvtier::testing
