#include "worker/cuda/shm_region.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

std::string UniqueName(const char* tag) {
  return absl::StrCat("/kvtier-test-", tag, "-", getpid());
}

TEST(ShmRegionTest, CreatedRegionIsSharedWithAnOpenerAndUnlinkedOnDestruction) {
  const std::string name = UniqueName("share");
  {
    std::unique_ptr<ShmRegion> a = *ShmRegion::Create(name, 1 << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
    a->data()[12345] = 77;
    std::unique_ptr<ShmRegion> b = *ShmRegion::Open(name);
    EXPECT_EQ(b->size(), 1u << 20);
    EXPECT_EQ(b->data()[12345], 77);
    EXPECT_EQ(ShmRegion::Create(name, 10).status().code(), absl::StatusCode::kAlreadyExists);
  }
  EXPECT_EQ(ShmRegion::Open(name).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmRegionTest, AnonymousRegionIsWritableAndPageAligned) {
  std::unique_ptr<ShmRegion> a = *ShmRegion::CreateAnonymous(3 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  a->data()[(3 << 20) - 1] = 9;
  EXPECT_EQ(a->data()[(3 << 20) - 1], 9);
  EXPECT_TRUE(a->name().empty());
  EXPECT_EQ(ShmRegion::CreateAnonymous(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRegionTest, RejectsBadNamesAndSizes) {
  EXPECT_EQ(ShmRegion::Create("no-slash", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("/a/b", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create(UniqueName("zero"), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::worker::cuda
