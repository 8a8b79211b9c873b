#include "core/layout/shm_abi.h"

#include "gtest/gtest.h"

namespace kvtier::layout {
namespace {

TEST(ShmAbiTest, FreshHeaderValidates) {
  PoolHeader h = MakePoolHeader(PoolKind::kDdr, 1 << 20, 42, 1);
  EXPECT_TRUE(ValidatePoolHeader(h, PoolKind::kDdr, 1 << 20).ok());
  EXPECT_EQ(h.data_bytes, (1u << 20) - kPoolDataOffset);
}

TEST(ShmAbiTest, RejectsEachCorruptedField) {
  const PoolHeader good = MakePoolHeader(PoolKind::kCompressed, 1 << 20, 42, 1);
  struct Case {
    const char* field;
    void (*corrupt)(PoolHeader&);
  } cases[] = {
      {"magic", [](PoolHeader& h) { h.magic ^= 1; }},
      {"abi_version", [](PoolHeader& h) { h.abi_version += 1; }},
      {"kind", [](PoolHeader& h) { h.kind = static_cast<uint32_t>(PoolKind::kDdr); }},
      {"total_bytes", [](PoolHeader& h) { h.total_bytes += 4096; }},
      {"data_offset", [](PoolHeader& h) { h.data_offset = 0; }},
      {"data_bytes", [](PoolHeader& h) { h.data_bytes += 1; }},
  };
  for (const Case& c : cases) {
    PoolHeader h = good;
    c.corrupt(h);
    absl::Status s = ValidatePoolHeader(h, PoolKind::kCompressed, 1 << 20);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
}

TEST(ShmAbiTest, RejectsMappingOfAnotherSize) {
  PoolHeader h = MakePoolHeader(PoolKind::kDdr, 1 << 20, 1, 1);
  EXPECT_FALSE(ValidatePoolHeader(h, PoolKind::kDdr, 1 << 21).ok());
}

}  // namespace
}  // namespace kvtier::layout
