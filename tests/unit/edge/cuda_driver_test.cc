// The run-time-loaded CUDA driver: loading where there is none, and the checks a loaded one
// must pass, over the fake driver (tests/support/fake_cuda_driver.h).

#include "edge/cuda_driver.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/support/fake_cuda_driver.h"

namespace kvtier::edge::cuda {
namespace {

using ::kvtier::testing::FakeCudaDriver;

TEST(CudaDriverTest, LoadingAMissingLibraryIsAClearStatusNotACrash) {
  const std::string lib = "libkvtier-no-such-cuda.so.1";
  absl::StatusOr<std::unique_ptr<Driver>> d = Driver::Load(lib);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status().message().rfind("no CUDA driver: ", 0), 0u) << d.status();
  EXPECT_NE(d.status().message().find(lib), std::string::npos) << d.status();
}

TEST(CudaDriverTest, ALibraryWithoutTheEntryPointsNamesTheMissingOne) {
  // libc loads everywhere and has no cuInit.
  absl::StatusOr<std::unique_ptr<Driver>> d = Driver::Load("libc.so.6");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("lacks cuInit"), std::string::npos) << d.status();
}

TEST(CudaDriverTest, AFailingCuInitIsReportedWithTheDriversError) {
  FakeCudaDriver fake;
  fake.FailNext("cuInit", 100);
  absl::StatusOr<std::unique_ptr<Driver>> d = Driver::FromTable(FakeCudaDriver::Table());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cuInit: fake CUDA error (CUresult 100)"), std::string::npos)
      << d.status();
}

TEST(CudaDriverTest, ATooOldDriverNamesBothVersions) {
  FakeCudaDriver fake;
  fake.version = 12010;
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  absl::Status s = d->CheckHostNumaVmm();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("12.1 (12010)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("12.2 (12020)"), std::string::npos) << s;
}

TEST(CudaDriverTest, NoDeviceOrNoHostNumaSupportIsRefused) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->CheckHostNumaVmm().ok());
  fake.devices = 0;
  EXPECT_NE(d->CheckHostNumaVmm().message().find("no device"), std::string::npos);
  fake.devices = 1;
  fake.host_numa_vmm_supported = 0;
  EXPECT_NE(d->CheckHostNumaVmm().message().find("host-NUMA virtual memory"), std::string::npos)
      << d->CheckHostNumaVmm();
}

TEST(CudaDriverTest, OutOfMemoryIsResourceExhaustedAndOtherErrorsFailedPrecondition) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->Check(2, "cuMemCreate").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d->Check(999, "cuMemMap").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->Check(999, "cuMemMap").message(), "cuMemMap: injected failure (CUresult 999)");
  EXPECT_TRUE(d->Check(kSuccess, "x").ok());
}

TEST(CudaDriverTest, ReportsTheNearestHostNumaNodeAndTheGranularity) {
  FakeCudaDriver fake;
  fake.host_numa_id = 3;
  fake.granularity = 4 << 20;
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->NearestHostNumaNode(), 3);
  fake.host_numa_id = -1;  // no NUMA: node 0
  EXPECT_EQ(d->NearestHostNumaNode(), 0);
  EXPECT_EQ(*d->HostGranularity(0), uint64_t{4} << 20);
  fake.FailNext("cuMemGetAllocationGranularity");
  EXPECT_FALSE(d->HostGranularity(0).ok());
}

}  // namespace
}  // namespace kvtier::edge::cuda
