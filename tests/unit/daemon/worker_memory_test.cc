#include "daemon/worker_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

constexpr uint64_t kExtent = 2ull << 20;

Extent Header(uint64_t worker) {
  auto h = Extent::CreateSealedHeader(
      "test-header", layout::MakePoolHeader(layout::PoolKind::kDdr, kExtent, 4, worker, 1, 1));
  EXPECT_TRUE(h.ok()) << h.status();
  return *std::move(h);
}

TEST(ExtentTest, IsReservedAtItsFullSizeAndCannotShrinkOrGrow) {
  auto e = Extent::Create("test-extent", kExtent, "");
  ASSERT_TRUE(e.ok()) << e.status();
  struct stat st;
  ASSERT_EQ(fstat(e->fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kExtent);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kExtent);  // fallocate'd, not sparse
  EXPECT_NE(ftruncate(e->fd(), kExtent / 2), 0);                  // a worker cannot shrink it
  EXPECT_NE(ftruncate(e->fd(), kExtent * 2), 0);
  void* m = mmap(nullptr, kExtent, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd(), 0);
  ASSERT_NE(m, MAP_FAILED);
  std::memset(m, 0xAB, kExtent);
  munmap(m, kExtent);
}

TEST(ExtentTest, SealedHeaderCannotBeWrittenByAnyone) {
  Extent h = Header(7);
  layout::PoolHeader read;
  ASSERT_EQ(pread(h.fd(), &read, sizeof(read), 0), static_cast<ssize_t>(sizeof(read)));
  EXPECT_TRUE(layout::ValidatePoolHeader(read, layout::PoolKind::kDdr, kExtent, 4, 7).ok());
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd(), 0), MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  EXPECT_LT(pwrite(h.fd(), "x", 1, 0), 0);
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, h.fd(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(mprotect(ro, 4096, PROT_READ | PROT_WRITE), 0);  // no way back to writable
  munmap(ro, 4096);
}

TEST(ExtentTest, AFullTmpfsIsResourceExhaustedNotACrash) {
  // A directory that cannot hold the extent: /dev/shm may be large, so ask for more than any
  // machine has.
  auto e = Extent::Create("too-big", 1ull << 50, "/dev/shm");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
}

TEST(WorkerMemoryTest, SlotsFillOneExtentBeforeTakingTheNextAndAddressThemBackToBack) {
  PoolBudget budget(layout::PoolKind::kDdr, 4 * kExtent, kExtent, "test-ddr", "");
  {
    WorkerMemory memory(&budget, 0, 4, Header(1));
    std::vector<Slot> slots;
    const uint64_t page = 512 * 1024;  // 4 per extent
    for (int i = 0; i < 6; ++i) {
      auto s = memory.Allocate(page);
      ASSERT_TRUE(s.ok()) << s.status();
      slots.push_back(*std::move(s));
    }
    EXPECT_EQ(memory.num_extents(), 2u);
    EXPECT_EQ(budget.reserved_bytes(), 2 * kExtent);
    for (int i = 0; i < 4; ++i) EXPECT_LT(slots[i].offset(), kExtent);
    for (int i = 4; i < 6; ++i) {
      EXPECT_GE(slots[i].offset(), kExtent);
      EXPECT_LT(slots[i].offset() + page, 2 * kExtent + 1);
    }
    EXPECT_TRUE(memory.CheckInvariants().ok());
    slots.clear();
  }
  EXPECT_EQ(budget.reserved_bytes(), 0u);  // the worker's extents went back with it
}

TEST(WorkerMemoryTest, BudgetAndMaxExtentsBoundWhatOneWorkerTakes) {
  PoolBudget budget(layout::PoolKind::kDdr, 3 * kExtent, kExtent, "test-ddr", "");
  WorkerMemory a(&budget, 0, 2, Header(1));
  WorkerMemory b(&budget, 0, 4, Header(2));
  std::vector<Slot> held;
  for (int i = 0; i < 2; ++i) {
    auto s = a.Allocate(kExtent);
    ASSERT_TRUE(s.ok()) << s.status();
    held.push_back(*std::move(s));
  }
  auto over_quota = a.Allocate(kExtent);
  EXPECT_EQ(over_quota.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over_quota.status().message().find("most extents"), absl::string_view::npos);
  auto last = b.Allocate(kExtent);
  ASSERT_TRUE(last.ok());
  held.push_back(*std::move(last));
  auto none_left = b.Allocate(16);
  EXPECT_EQ(none_left.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none_left.status().message().find("budget full"), absl::string_view::npos);
  held.clear();
}

}  // namespace
}  // namespace kvtier::daemon
