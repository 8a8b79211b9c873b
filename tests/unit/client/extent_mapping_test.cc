// The client's mapping of a worker's pool, against a real core and memory channel: memfd pools
// as before, CUDA VMM pools imported and mapped through the fake driver (no driver exists here),
// and an import that fails naming the pool and the driver's error, with nothing leaked.

#include "client/lib/extent_mapping.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/client/fake_vmm_daemon.h"

namespace kvtier::internal {
namespace {

using ::kvtier::testing::FakeCudaDriver;
namespace dt = ::kvtier::daemon::testing;

class ExtentMappingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        daemon_.Start(GetParam(), absl::StrCat(::testing::TempDir(), "/em-", getpid(), ".mem")));
    path_ = daemon_.channel_path;
    options_ = daemon_.options;
    worker_ = std::make_unique<dt::SimWorker>(daemon_.env->core.get());
  }

  // A plan that puts pages in the DDR pool, so that the worker holds extents there.
  uint32_t GrantDdrExtents() {
    auto seq = worker_->Open(0, dt::Policy("hierarchy", 0.1, 0, 0));
    EXPECT_TRUE(seq.ok());
    auto plan = worker_->Snapshot(*seq, 800, dt::RampScores(50));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->ddr_extents() : 0;
  }

  // The fake daemon runs in this process, as this uid: the default set takes it.
  static const edge::DaemonUids& Daemon() {
    static const edge::DaemonUids* daemon = new edge::DaemonUids(*edge::ResolveDaemonUids(-1));
    return *daemon;
  }

  const v1::PoolDescriptor& Ddr() const { return worker_->registration().pools(0); }

  absl::StatusOr<std::shared_ptr<ExtentMapping>> Map() {
    return ExtentMapping::Reserve(Ddr(), worker_->id(), worker_->registration().daemon_epoch(),
                                  options_.cuda);
  }

  FakeCudaDriver fake_;  // first: outlives everything that calls it
  testing::FakeVmmDaemon daemon_;
  daemon::CoreOptions options_;
  std::string path_;
  std::unique_ptr<dt::SimWorker> worker_;
};

TEST_P(ExtentMappingTest, TwoMappingsOfOnePoolShareItsBytesAndSayHowTheyAreMapped) {
  const bool vmm = GetParam() == "cuda_vmm";
  ASSERT_EQ(Ddr().memory(), vmm ? v1::POOL_MEMORY_CUDA_VMM : v1::POOL_MEMORY_MEMFD);
  const uint32_t n = GrantDdrExtents();
  ASSERT_GE(n, 1u);
  auto a = Map();
  auto b = Map();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE((*a)->Grow(n, path_, worker_->secret(), Daemon()).ok());
  ASSERT_TRUE((*b)->Grow(n, path_, worker_->secret(), Daemon()).ok());
  EXPECT_EQ((*a)->mapped_extents(), n);
  EXPECT_EQ((*a)->device_mapped(), vmm);
  const uint64_t last = uint64_t{n} * Ddr().extent_bytes() - 1;
  (*a)->data()[last] = 0x3C;
  EXPECT_EQ((*b)->data()[last], 0x3C);
  a->reset();
  b->reset();
  EXPECT_EQ(fake_.live_handles(), 0);
  EXPECT_EQ(fake_.live_mappings(), 0);
  EXPECT_EQ(fake_.live_reservations(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, ExtentMappingTest, ::testing::Values("memfd", "cuda_vmm"));

class VmmExtentMappingTest : public ExtentMappingTest {};

TEST_P(VmmExtentMappingTest, AFailedImportNamesThePoolAndTheDriversErrorAndLeaksNothing) {
  const uint32_t n = GrantDdrExtents();
  ASSERT_GE(n, 1u);
  auto m = Map();
  ASSERT_TRUE(m.ok()) << m.status();
  fake_.FailNext("cuMemImportFromShareableHandle");
  absl::Status s = (*m)->Grow(n, path_, worker_->secret(), Daemon());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("DDR pool extent 0: cuMemImportFromShareableHandle"),
            std::string::npos)
      << s;
  EXPECT_EQ((*m)->vmm_failure(), s.message());
  EXPECT_EQ((*m)->mapped_extents(), 0u);
  m->reset();
  EXPECT_EQ(fake_.live_handles(), 0);
  EXPECT_EQ(fake_.live_mappings(), 0);
  EXPECT_EQ(fake_.live_reservations(), 0);
}

TEST_P(VmmExtentMappingTest, AVmmPoolWithoutADriverIsRefusedNamingThePool) {
  auto m = ExtentMapping::Reserve(Ddr(), worker_->id(), 1,
                                  absl::FailedPreconditionError("no CUDA driver: libcuda.so.1"));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("DDR pool is CUDA VMM memory: no CUDA driver"),
            std::string::npos)
      << m.status();
}

INSTANTIATE_TEST_SUITE_P(Vmm, VmmExtentMappingTest, ::testing::Values("cuda_vmm"));

}  // namespace
}  // namespace kvtier::internal
