// The fake CUDA driver's own contract, which the CUDA VMM tests rely on: KVTIER_FAKE_CUDA
// configuration (what it reports, which call fails after how many, for what sizes) and the
// shared library that edge::cuda::Driver::Load opens by name.

#include <cstdlib>
#include <string>

#include "edge/cuda_driver.h"
#include "edge/cuda_vmm.h"
#include "gtest/gtest.h"
#include "tests/support/fake_cuda_driver.h"

namespace kvtier::testing {
namespace {

using edge::cuda::Driver;
using edge::cuda::MemHandle;

TEST(FakeCudaConfigureTest, SetsWhatTheDriverReports) {
  FakeCudaDriver fake;
  ASSERT_TRUE(fake.Configure("version=12010, devices=2,granularity=65536,host_numa_id=1").ok());
  EXPECT_EQ(fake.version, 12010);
  EXPECT_EQ(fake.devices, 2);
  EXPECT_EQ(fake.granularity, 65536u);
  EXPECT_EQ(fake.host_numa_id, 1);
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->version(), 12010);
  EXPECT_FALSE(d->CheckHostNumaVmm().ok());
}

TEST(FakeCudaConfigureTest, AnEntryPointFailsOnceItsFirstNCallsSucceeded) {
  FakeCudaDriver fake;
  ASSERT_TRUE(fake.Configure("cuDeviceGet:after=2").ok());
  const auto api = FakeCudaDriver::Table();
  edge::cuda::Device dev = 0;
  EXPECT_EQ(api.DeviceGet(&dev, 0), edge::cuda::kSuccess);
  EXPECT_EQ(api.DeviceGet(&dev, 0), edge::cuda::kSuccess);
  EXPECT_EQ(api.DeviceGet(&dev, 0), FakeCudaDriver::kInjected);
  EXPECT_EQ(api.DeviceGet(&dev, 0), FakeCudaDriver::kInjected);  // and every later call
  int count = 0;
  EXPECT_EQ(api.DeviceGetCount(&count), edge::cuda::kSuccess);  // other entry points do not
}

TEST(FakeCudaConfigureTest, AboveLimitsTheRuleToLargerCallsAndOomIsOutOfMemory) {
  FakeCudaDriver fake;
  fake.granularity = 1 << 20;
  ASSERT_TRUE(fake.Configure("cuMemCreate:oom:above=2097152").ok());
  std::shared_ptr<const Driver> d = fake.Load();
  ASSERT_NE(d, nullptr);
  absl::StatusOr<edge::UniqueFd> small = edge::cuda::CreateExportedHostAllocation(*d, 2 << 20, 0);
  EXPECT_TRUE(small.ok()) << small.status();
  absl::StatusOr<edge::UniqueFd> large = edge::cuda::CreateExportedHostAllocation(*d, 4 << 20, 0);
  ASSERT_FALSE(large.ok());
  EXPECT_EQ(large.status().code(), absl::StatusCode::kResourceExhausted) << large.status();
  EXPECT_NE(large.status().message().find("cuMemCreate(4 MiB"), std::string::npos);
  EXPECT_EQ(fake.live_handles(), 0);
}

TEST(FakeCudaConfigureTest, ABadItemIsRefusedNamingIt) {
  for (const char* bad : {"cuMemImport", "version=old", "granularity=0", "colour=3",
                          "cuMemMap:after=x", "cuMemMap:twice"}) {
    FakeCudaDriver fake;
    absl::Status s = fake.Configure(absl::StrCat("devices=1,", bad));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(absl::StrCat("KVTIER_FAKE_CUDA: item \"", bad, "\"")),
              std::string::npos)
        << s;
  }
}

// The library by name, as kvtierd and workers load it. Its instance is configured from the
// environment at its first call, so this sets KVTIER_FAKE_CUDA before anything loads it.
TEST(FakeCudaLibraryTest, LoadsByNameAndRunsTheVmmPathOverRealMemory) {
  const char* dir = std::getenv("KVTIER_BUILD_DIR");
  const std::string path = absl::StrCat(dir ? dir : "build", "/bin/libkvtier_fake_cuda.so");
  setenv(FakeCudaDriver::kEnv, "version=12080,cuMemMap:after=1", 1);
  absl::StatusOr<std::unique_ptr<Driver>> d = Driver::Load(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->version(), 12080);
  EXPECT_TRUE((*d)->CheckHostNumaVmm().ok());
  absl::StatusOr<edge::UniqueFd> fd = edge::cuda::CreateExportedHostAllocation(**d, 2 << 20, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto range = edge::cuda::VmmRange::Reserve(d->get(), 4 << 20, 2 << 20, 0);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE((*range)->MapAt(fd->get(), 0, 2 << 20).ok());
  (*range)->base()[5] = 42;  // host access was granted
  EXPECT_EQ((*range)->base()[5], 42);
  absl::Status second = (*range)->MapAt(fd->get(), 2 << 20, 2 << 20);
  EXPECT_NE(second.message().find("cuMemMap: injected failure (CUresult 999)"), std::string::npos)
      << second;
}

}  // namespace
}  // namespace kvtier::testing
