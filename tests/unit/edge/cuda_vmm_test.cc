// CUDA VMM pool memory end to end over the fake driver: the daemon's create + export, the
// descriptor over a real memory-channel socket pair (SCM_RIGHTS), the worker's import + map +
// access; and every step failing in turn, with nothing leaked.

#include "edge/cuda_vmm.h"

#include <dirent.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/fake_cuda_driver.h"

namespace kvtier::edge::cuda {
namespace {

using ::kvtier::testing::FakeCudaDriver;

constexpr uint64_t kExtent = 2 << 20;

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// The descriptor after a trip over a SOCK_SEQPACKET pair, as the memory channel carries it.
absl::StatusOr<UniqueFd> OverTheChannel(const UniqueFd& fd) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return absl::InternalError("socketpair");
  }
  UniqueFd a(pair[0]), b(pair[1]);
  v1::ChannelReply reply;
  reply.set_extent_count(1);
  const int raw = fd.get();
  if (absl::Status s = SendMessage(a.get(), reply, {&raw, 1}); !s.ok()) return s;
  v1::ChannelReply got;
  absl::StatusOr<std::vector<UniqueFd>> fds = ReceiveMessage(b.get(), &got);
  if (!fds.ok()) return fds.status();
  if (fds->size() != 1) return absl::InternalError("expected one descriptor");
  return std::move((*fds)[0]);
}

// Daemon creates, the channel carries, the worker maps at `offset` of a two-extent range and
// writes `byte` through the host view. Returns the first failing step's status.
absl::Status Chain(const Driver& driver, uint8_t byte, std::unique_ptr<VmmRange>* out) {
  absl::StatusOr<UniqueFd> exported = CreateExportedHostAllocation(driver, kExtent, 0);
  if (!exported.ok()) return exported.status();
  absl::StatusOr<UniqueFd> received = OverTheChannel(*exported);
  if (!received.ok()) return received.status();
  absl::StatusOr<std::unique_ptr<VmmRange>> range =
      VmmRange::Reserve(&driver, 2 * kExtent, kExtent, 0);
  if (!range.ok()) return range.status();
  if (absl::Status s = (*range)->MapAt(received->get(), kExtent, kExtent); !s.ok()) return s;
  std::memset((*range)->base() + kExtent, byte, kExtent);
  *out = *std::move(range);
  return absl::OkStatus();
}

TEST(CudaVmmTest, ADaemonAllocationCrossesTheChannelAndMapsForDevicesAndHost) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  const int fds_before = OpenFds();
  fake.calls.clear();
  std::unique_ptr<VmmRange> range;
  ASSERT_TRUE(Chain(*driver, 0x5A, &range).ok());
  const std::vector<std::string> expected = {
      "cuMemCreate", "cuMemExportToShareableHandle", "cuMemRelease",
      // the worker's own driver checked first
      "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute", "cuDeviceGetAttribute",
      "cuDeviceGetCount", "cuDeviceGet", "cuMemAddressReserve", "cuMemImportFromShareableHandle",
      "cuMemMap", "cuMemRelease", "cuMemSetAccess"};
  EXPECT_EQ(fake.calls, expected);
  EXPECT_EQ(range->base()[kExtent], 0x5A);
  EXPECT_EQ(range->base()[2 * kExtent - 1], 0x5A);
  // Only the mapping holds the memory now: every handle was released, every descriptor closed.
  EXPECT_EQ(fake.live_handles(), 0);
  EXPECT_EQ(fake.live_mappings(), 1);
  range.reset();
  EXPECT_EQ(fake.live_mappings(), 0);
  EXPECT_EQ(fake.live_reservations(), 0);
  EXPECT_EQ(OpenFds(), fds_before);
}

TEST(CudaVmmTest, TwoImportsOfOneExportSeeTheSameMemory) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  absl::StatusOr<UniqueFd> fd = CreateExportedHostAllocation(*driver, kExtent, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto a = VmmRange::Reserve(driver.get(), kExtent, kExtent, 0);
  auto b = VmmRange::Reserve(driver.get(), kExtent, kExtent, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->MapAt(fd->get(), 0, kExtent).ok());
  ASSERT_TRUE((*b)->MapAt(fd->get(), 0, kExtent).ok());
  (*a)->base()[123] = 77;
  EXPECT_EQ((*b)->base()[123], 77);
}

class CudaVmmFailureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaVmmFailureTest, EveryFailingStepIsNamedAndLeaksNothing) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  const int fds_before = OpenFds();
  fake.FailNext(GetParam());
  std::unique_ptr<VmmRange> range;
  absl::Status s = Chain(*driver, 1, &range);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(range, nullptr);
  EXPECT_NE(s.message().find(GetParam()), std::string::npos) << s;
  EXPECT_NE(s.message().find("injected failure (CUresult 999)"), std::string::npos) << s;
  EXPECT_EQ(fake.live_handles(), 0);
  EXPECT_EQ(fake.live_mappings(), 0);
  EXPECT_EQ(fake.live_reservations(), 0);
  EXPECT_EQ(OpenFds(), fds_before);
}

INSTANTIATE_TEST_SUITE_P(EachStep, CudaVmmFailureTest,
                         ::testing::Values("cuMemCreate", "cuMemExportToShareableHandle",
                                           "cuMemAddressReserve", "cuMemImportFromShareableHandle",
                                           "cuMemMap", "cuMemSetAccess"));

TEST(CudaVmmTest, AHostThatCannotPinIsResourceExhausted) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  fake.FailNext("cuMemCreate", 2);  // CUDA_ERROR_OUT_OF_MEMORY
  absl::StatusOr<UniqueFd> fd = CreateExportedHostAllocation(*driver, kExtent, 1);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fd.status().message().find("host NUMA node 1"), std::string::npos) << fd.status();
}

// A worker's own driver decides whether it can map a host-NUMA pool, whatever the daemon's said.
TEST(CudaVmmTest, ADriverWithoutHostNumaVmmReservesNothing) {
  for (const char* spec : {"version=12010", "host_numa_vmm=0", "devices=0"}) {
    FakeCudaDriver fake;
    ASSERT_TRUE(fake.Configure(spec).ok()) << spec;
    std::shared_ptr<const Driver> driver = fake.Load();
    ASSERT_NE(driver, nullptr);
    fake.calls.clear();
    auto range = VmmRange::Reserve(driver.get(), kExtent, kExtent, 0);
    EXPECT_EQ(range.status().code(), absl::StatusCode::kFailedPrecondition) << spec;
    EXPECT_EQ(range.status().message(), driver->CheckHostNumaVmm().message()) << spec;
    EXPECT_EQ(std::count(fake.calls.begin(), fake.calls.end(), "cuMemAddressReserve"), 0) << spec;
    EXPECT_EQ(fake.live_reservations(), 0) << spec;
  }
}

TEST(CudaVmmTest, MappingOutsideTheRangeIsRefusedBeforeTheDriverIsAsked) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  auto range = VmmRange::Reserve(driver.get(), kExtent, kExtent, 0);
  ASSERT_TRUE(range.ok());
  fake.calls.clear();
  EXPECT_EQ((*range)->MapAt(0, kExtent, kExtent).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(fake.calls.empty());
  EXPECT_EQ(VmmRange::Reserve(driver.get(), kExtent + 1, kExtent, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The driver takes only power-of-two alignments (the fake refuses others as it does), and the
// daemon allows any multiple of the granularity as an extent: 12 MiB extents reserve and map.
TEST(CudaVmmTest, ExtentsThatAreNotAPowerOfTwoReserveAndMap) {
  FakeCudaDriver fake;
  std::shared_ptr<const Driver> driver = fake.Load();
  ASSERT_NE(driver, nullptr);
  for (uint64_t extent : {uint64_t{12} << 20, uint64_t{6} << 20, uint64_t{2} << 20}) {
    auto range = VmmRange::Reserve(driver.get(), 3 * extent, extent, 0);
    ASSERT_TRUE(range.ok()) << extent << ": " << range.status();
    for (uint64_t i = 0; i < 3; ++i) {
      absl::StatusOr<UniqueFd> fd = CreateExportedHostAllocation(*driver, extent, 0);
      ASSERT_TRUE(fd.ok()) << fd.status();
      ASSERT_TRUE((*range)->MapAt(fd->get(), i * extent, extent).ok()) << extent << " " << i;
      (*range)->base()[i * extent + extent - 1] = static_cast<uint8_t>(i + 1);
    }
    EXPECT_EQ((*range)->base()[3 * extent - 1], 3);
  }
  EXPECT_EQ(fake.live_reservations(), 0);
}

}  // namespace
}  // namespace kvtier::edge::cuda
