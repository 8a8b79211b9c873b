// kvtier-gpu-probe (scripts/gpu-check's first step) as a process over the fake driver library:
// every fact printed, the create/export/import/map/write round trip across two processes, and a
// clear FAIL naming the step when the driver refuses one, or when there is no driver.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

struct ProbeRun {
  std::string out;
  int exit_code = -1;
};

ProbeRun Probe(const std::string& library, const std::string& fake_config) {
  const char* dir = std::getenv("KVTIER_BUILD_DIR");
  const std::string bin = absl::StrCat(dir ? dir : "build", "/bin/");
  const std::string lib = library.empty() ? bin + "libkvtier_fake_cuda.so" : library;
  const std::string cmd = absl::StrCat("KVTIER_FAKE_CUDA='", fake_config, "' ", bin,
                                       "kvtier-gpu-probe --cuda-library=", lib, " 2>&1");
  ProbeRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(GpuProbeTest, PrintsEveryFactAndRoundTripsAnAllocationThroughAChildProcess) {
  const ProbeRun r = Probe("", "version=12080,granularity=2097152,host_numa_id=0");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* line :
       {"driver_version=12080\n", "devices=1\n", "vmm_supported=1\n", "host_numa_id=0\n",
        "host_numa_vmm_supported=1\n", "host_granularity=2097152\n",
        "create_export_import_map_write=ok\n", "probe=PASS\n"}) {
    EXPECT_THAT(r.out, HasSubstr(line));
  }
  for (const char* key : {"host_numa_nodes=", "ulimit_l_kib=", "dev_shm_mib="}) {
    EXPECT_THAT(r.out, HasSubstr(key));
  }
}

TEST(GpuProbeTest, AnImportTheDriverRefusesFailsNamingTheStep) {
  // The child's own fake refuses every import; the parent's create and export succeed.
  const ProbeRun r = Probe("", "cuMemImportFromShareableHandle");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("cuMemImportFromShareableHandle"));
  EXPECT_THAT(r.out, HasSubstr("create_export_import_map_write=the importing child ended"));
  EXPECT_THAT(r.out, HasSubstr("probe=FAIL\n"));
}

TEST(GpuProbeTest, NoDriverIsAFailWithTheReasonAndTheHostFactsStillPrinted) {
  const ProbeRun r = Probe("libkvtier-no-such-driver.so", "");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("driver=no CUDA driver: libkvtier-no-such-driver.so"));
  EXPECT_THAT(r.out, HasSubstr("dev_shm_mib="));
  EXPECT_THAT(r.out, HasSubstr("probe=FAIL\n"));
}

}  // namespace
