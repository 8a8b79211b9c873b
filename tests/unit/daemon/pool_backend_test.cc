// pools.backend resolved at start (daemon/pool_backend.h), over the fake CUDA driver, and a core
// that serves CUDA VMM pools: what the wire says and what a worker asking for memfd gets.

#include "daemon/pool_backend.h"

#include <fcntl.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/support/fake_cuda_driver.h"
#include "tests/unit/daemon/core_test_util.h"

namespace kvtier::daemon {
namespace {

using ::kvtier::testing::FakeCudaDriver;

DriverLoader NoDriver() {
  return [] {
    return absl::StatusOr<std::unique_ptr<edge::cuda::Driver>>(
        absl::FailedPreconditionError("no CUDA driver: libcuda.so.1: cannot open shared object"));
  };
}

DriverLoader Fake() {
  return [] { return edge::cuda::Driver::FromTable(FakeCudaDriver::Table()); };
}

CoreOptions Options(const std::string& backend) {
  CoreOptions o = testing::SmallOptions(32ull << 20, 32ull << 20);  // 2 MiB extents
  o.pool_backend = backend;
  return o;
}

bool BothPools(const CoreOptions& o, ExtentMemory m) {
  return o.pool_memory[0] == m && o.pool_memory[1] == m;
}

TEST(PoolBackendTest, MemfdNeverLoadsTheDriver) {
  CoreOptions o = Options("memfd");
  bool loaded = false;
  auto line = ResolvePoolBackend(&o, [&] {
    loaded = true;
    return NoDriver()();
  });
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_FALSE(loaded);
  EXPECT_TRUE(BothPools(o, ExtentMemory::kMemfd));
  EXPECT_EQ(o.cuda, nullptr);
}

TEST(PoolBackendTest, AutoWithoutADriverServesMemfdAndSaysWhy) {
  CoreOptions o = Options("auto");
  auto line = ResolvePoolBackend(&o, NoDriver());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(BothPools(o, ExtentMemory::kMemfd));
  EXPECT_NE(line->find("DDR memfd (no CUDA driver: libcuda.so.1"), std::string::npos) << *line;
}

TEST(PoolBackendTest, CudaVmmWithoutADriverIsAnErrorNamingTheBackend) {
  CoreOptions o = Options("cuda_vmm");
  auto line = ResolvePoolBackend(&o, NoDriver());
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(line.status().message().find("pools.backend = \"cuda_vmm\": no CUDA driver"),
            std::string::npos)
      << line.status();
}

TEST(PoolBackendTest, AutoWithAWorkingDriverMakesBothPoolsCudaVmmOnTheNearestNode) {
  FakeCudaDriver fake;
  fake.host_numa_id = 1;
  CoreOptions o = Options("auto");
  auto line = ResolvePoolBackend(&o, Fake());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(BothPools(o, ExtentMemory::kCudaVmm));
  EXPECT_EQ(o.pinned_numa_node, 1);
  ASSERT_NE(o.cuda, nullptr);
  EXPECT_NE(line->find("CUDA VMM pinned on host NUMA node 1"), std::string::npos) << *line;
  EXPECT_EQ(fake.live_handles(), 0);  // the probe extents are gone
}

TEST(PoolBackendTest, AConfiguredNumaNodeWins) {
  FakeCudaDriver fake;
  fake.host_numa_id = 1;
  CoreOptions o = Options("cuda_vmm");
  o.numa_node = 0;
  ASSERT_TRUE(ResolvePoolBackend(&o, Fake()).ok());
  EXPECT_EQ(o.pinned_numa_node, 0);
}

TEST(PoolBackendTest, ExtentsOffTheGranularityNamePoolsExtentMibAndTheGranularity) {
  FakeCudaDriver fake;
  fake.granularity = 3 << 20;
  CoreOptions o = Options("cuda_vmm");
  auto line = ResolvePoolBackend(&o, Fake());
  EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(line.status().message().find("pools.extent_mib"), std::string::npos);
  EXPECT_NE(line.status().message().find(std::to_string(3 << 20)), std::string::npos)
      << line.status();
  CoreOptions a = Options("auto");
  auto fallback = ResolvePoolBackend(&a, Fake());
  ASSERT_TRUE(fallback.ok());
  EXPECT_TRUE(BothPools(a, ExtentMemory::kMemfd));
  EXPECT_EQ(a.cuda, nullptr);
}

TEST(PoolBackendTest, APoolTheHostCannotPinFallsBackAloneUnderAuto) {
  FakeCudaDriver fake;
  fake.FailNext("cuMemCreate", 2);  // the DDR probe: out of memory
  CoreOptions o = Options("auto");
  auto line = ResolvePoolBackend(&o, Fake());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(o.pool_memory[0], ExtentMemory::kMemfd);
  EXPECT_EQ(o.pool_memory[1], ExtentMemory::kCudaVmm);
  EXPECT_NE(line->find("DDR memfd (cuMemCreate"), std::string::npos) << *line;
  fake.FailNext("cuMemCreate", 2);
  CoreOptions strict = Options("cuda_vmm");
  auto refused = ResolvePoolBackend(&strict, Fake());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("DDR pool: cuMemCreate"), std::string::npos)
      << refused.status();
}

TEST(PoolBackendTest, ATooOldDriverOrAnExtentDirKeepsMemfdUnderAuto) {
  FakeCudaDriver fake;
  fake.version = 11080;
  CoreOptions o = Options("auto");
  auto line = ResolvePoolBackend(&o, Fake());
  ASSERT_TRUE(line.ok());
  EXPECT_TRUE(BothPools(o, ExtentMemory::kMemfd));
  EXPECT_NE(line->find("11.8 (11080)"), std::string::npos) << *line;
  fake.version = 13000;
  CoreOptions dir = Options("cuda_vmm");
  dir.extent_dir = "/dev/shm";
  EXPECT_EQ(ResolvePoolBackend(&dir, Fake()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PoolBackendTest, AnUnknownBackendNamesTheFieldAndTheValue) {
  CoreOptions o = Options("cuda");
  auto line = ResolvePoolBackend(&o, NoDriver());
  EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(line.status().message().find("pools.backend = \"cuda\""), std::string::npos);
}

// A core over CUDA VMM pools (from the fake driver) hands out exported allocations; a worker that
// asks for memfd gets memfd extents from the same budget.
class VmmCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = Options("cuda_vmm");
    ASSERT_TRUE(ResolvePoolBackend(&options_, Fake()).ok());
    env_ = std::make_unique<testing::Env>(options_);
    ASSERT_NE(env_->core, nullptr);
  }
  FakeCudaDriver fake_;  // before the core: outlives it
  CoreOptions options_;
  std::unique_ptr<testing::Env> env_;
};

TEST_F(VmmCoreTest, DescriptorsSayCudaVmmAndGrantsAreExportedAllocations) {
  testing::SimWorker w(env_->core.get());
  for (const v1::PoolDescriptor& d : w.registration().pools()) {
    EXPECT_EQ(d.memory(), v1::POOL_MEMORY_CUDA_VMM);
    EXPECT_EQ(d.numa_node(), options_.pinned_numa_node);
  }
  auto seq = w.Open(0, testing::Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  const auto created = std::count(fake_.calls.begin(), fake_.calls.end(), "cuMemCreate");
  auto plan = w.Snapshot(*seq, 800, testing::RampScores(50));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GE(plan->ddr_extents(), 1u);
  EXPECT_GT(std::count(fake_.calls.begin(), fake_.calls.end(), "cuMemCreate"), created);
  EXPECT_EQ(fake_.live_handles(), 0);  // the daemon keeps descriptors only, never a mapping
  EXPECT_EQ(fake_.live_mappings(), 0);
}

TEST_F(VmmCoreTest, AWorkerAskingForMemfdGetsMemfdPools) {
  v1::RegisterWorkerRequest r = testing::WorkerRequest();
  r.set_pool_memory(v1::POOL_MEMORY_MEMFD);
  testing::SimWorker w(env_->core.get(), r);
  for (const v1::PoolDescriptor& d : w.registration().pools()) {
    EXPECT_EQ(d.memory(), v1::POOL_MEMORY_MEMFD);
  }
  auto seq = w.Open(0, testing::Policy("hierarchy", 0.1, 0, 0));
  ASSERT_TRUE(seq.ok());
  fake_.calls.clear();
  auto plan = w.Snapshot(*seq, 800, testing::RampScores(50));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GE(plan->ddr_extents(), 1u);
  EXPECT_EQ(std::count(fake_.calls.begin(), fake_.calls.end(), "cuMemCreate"), 0);
  v1::FetchExtents f = w.Signed(v1::FetchExtents());
  f.set_kind(v1::POOL_KIND_DDR);
  std::vector<edge::UniqueFd> fds;
  ASSERT_TRUE(env_->core->FetchExtents(testing::SelfPeer(), f, &fds).ok());
  ASSERT_GE(fds.size(), 2u);
  // A daemon memfd extent is sealed against growing; the fake's exported allocations are unsealed
  // memfds, so the seal tells them apart.
  EXPECT_NE(fcntl(fds[1].get(), F_GET_SEALS) & F_SEAL_GROW, 0);
}

TEST(PoolMemoryRequestTest, AskingForCudaVmmFromMemfdPoolsIsRefusedSayingWhy) {
  testing::Env env;
  v1::RegisterWorkerRequest r = testing::WorkerRequest();
  r.set_pool_memory(v1::POOL_MEMORY_CUDA_VMM);
  auto resp = testing::Register(env.core.get(), r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(resp.status().message().find("pool_memory CUDA_VMM"), std::string::npos)
      << resp.status();
  r.set_pool_memory(static_cast<v1::PoolMemory>(7));
  EXPECT_EQ(testing::Register(env.core.get(), r).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::daemon
