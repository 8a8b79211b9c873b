#include "core/layout/shm_abi.h"

#include "gtest/gtest.h"

namespace kvtier::layout {
namespace {

constexpr uint64_t kExtent = 16ull << 20;

TEST(ShmAbiTest, FreshHeaderValidates) {
  PoolHeader h = MakePoolHeader(PoolKind::kDdr, kExtent, 8, 77, 42, 1);
  EXPECT_TRUE(ValidatePoolHeader(h, PoolKind::kDdr, kExtent, 8, 77).ok());
  EXPECT_EQ(h.abi_version, 2u);
}

TEST(ShmAbiTest, EveryCorruptFieldIsNamed) {
  const PoolHeader good = MakePoolHeader(PoolKind::kCompressed, kExtent, 8, 77, 42, 1);
  struct Case {
    const char* field;
    void (*corrupt)(PoolHeader&);
  } cases[] = {
      {"magic", [](PoolHeader& h) { h.magic ^= 1; }},
      {"abi_version", [](PoolHeader& h) { h.abi_version = 1; }},
      {"kind", [](PoolHeader& h) { h.kind = static_cast<uint32_t>(PoolKind::kDdr); }},
      {"header_bytes", [](PoolHeader& h) { h.header_bytes = 4; }},
      {"extent_bytes", [](PoolHeader& h) { h.extent_bytes += 4096; }},
      {"max_extents", [](PoolHeader& h) { h.max_extents = 9; }},
      {"worker_id", [](PoolHeader& h) { h.worker_id = 78; }},
  };
  for (const Case& c : cases) {
    PoolHeader h = good;
    c.corrupt(h);
    absl::Status s = ValidatePoolHeader(h, PoolKind::kCompressed, kExtent, 8, 77);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s.message();
  }
}

TEST(ShmAbiTest, ExtentSizeMustMatchWhatRegistrationSaid) {
  PoolHeader h = MakePoolHeader(PoolKind::kDdr, kExtent, 8, 1, 1, 1);
  EXPECT_FALSE(ValidatePoolHeader(h, PoolKind::kDdr, 2 * kExtent, 8, 1).ok());
}

}  // namespace
}  // namespace kvtier::layout
