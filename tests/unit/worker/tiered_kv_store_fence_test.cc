// TieredKvStore over a recording backend whose copies land only when the test says so: what
// a device backend's copy streams do. Checks the store's side of the fencing contract, plan
// order and refusal before any copy, with no GPU.

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/store_rig.h"
#include "worker/host_kv_backend.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker {
namespace {

using ::kvtier::tiering::Move;
using ::kvtier::tiering::Tier;
using ::kvtier::worker::testing::RandomVector;
using ::kvtier::worker::testing::Rig;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Name(Tier t) { return std::string(tiering::TierName(t)); }

// Host memory that claims not to be (what a device arena says), so the store treats the
// backend as a device one: appends only into T0, the page being written stays there.
class DeviceLikeArena final : public DeviceArena {
 public:
  explicit DeviceLikeArena(uint64_t capacity) : host_(capacity) {}
  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes) override { return host_.Allocate(bytes); }
  void Free(uint8_t* block, uint64_t bytes) override { host_.Free(block, bytes); }
  uint64_t capacity_bytes() const override { return host_.capacity_bytes(); }
  uint64_t used_bytes() const override { return host_.used_bytes(); }
  bool host_accessible() const override { return false; }

 private:
  HostArena host_;
};

// Moves bytes like the host backend (so results are checkable) but every copy gets a new token
// that completes only at Land() or Wait(); every call is logged.
class RecordingBackend final : public KvBackend {
 public:
  RecordingBackend(const HostKvBackendOptions& options, bool host_t0, std::vector<std::string>* log)
      : host_(options), host_t0_(host_t0), log_(log) {}

  bool host_t0() const override { return host_t0_; }
  absl::Status ClearBlock(uint8_t* block, uint64_t bytes) override {
    return host_.ClearBlock(block, bytes);
  }
  absl::Status WriteRows(uint8_t* kd, uint8_t* vd, const float* k, const float* v, uint32_t rows,
                         uint64_t row_floats) override {
    return host_.WriteRows(kd, vd, k, v, rows, row_floats);
  }
  absl::Status CopyPage(Tier from, const uint8_t* src, Tier to, uint8_t* dst,
                        uint64_t bytes) override {
    Issue(absl::StrCat("copy ", Name(from), "->", Name(to)));
    return host_.CopyPage(from, src, to, dst, bytes);
  }
  absl::Status EncodePage(Tier from, const uint8_t* src, uint32_t group, uint32_t rows,
                          uint8_t* dst) override {
    Issue(absl::StrCat("encode ", Name(from), "->T2"));
    return host_.EncodePage(from, src, group, rows, dst);
  }
  absl::Status DecodePage(const uint8_t* src, uint32_t group, uint32_t rows, Tier to,
                          uint8_t* dst) override {
    Issue(absl::StrCat("decode T2->", Name(to)));
    return host_.DecodePage(src, group, rows, to, dst);
  }
  absl::Status ReadPage(const StoredPage& page, uint32_t group, const uint8_t* ddr,
                        const uint8_t* compressed, float* dst) override {
    return host_.ReadPage(page, group, ddr, compressed, dst);
  }
  CopyToken LastToken() override { return issued_ == landed_ ? kNoCopyPending : issued_; }
  bool Completed(CopyToken t) override { return t <= landed_; }
  absl::Status Wait(CopyToken t) override {
    log_->push_back(absl::StrCat("wait ", t));
    Land(t);
    return absl::OkStatus();
  }
  void Forget(uint32_t group, uint32_t page) override { host_.Forget(group, page); }
  absl::Status Attend(const AttendCall& call, StoreStats& stats) override {
    return host_.Attend(call, stats);
  }

  void Land(CopyToken t) { landed_ = std::max(landed_, t); }
  void LandAll() { Land(issued_); }
  CopyToken issued() const { return issued_; }

 private:
  void Issue(std::string what) {
    ++issued_;
    log_->push_back(absl::StrCat(what, " #", issued_));
  }
  HostKvBackend host_;
  bool host_t0_;
  std::vector<std::string>* log_;
  CopyToken issued_ = 0, landed_ = 0;
};

class FencedStoreTest : public ::testing::Test {
 protected:
  void Make(bool host_t0, uint64_t arena_bytes = uint64_t{1} << 24) {
    options_.geometry = testing::SmolLmGeometry(4);
    options_.geometry.num_layers = 2;
    options_.num_q_heads = 3;
    if (host_t0) {
      arena_ = std::make_unique<HostArena>(arena_bytes);
    } else {
      arena_ = std::make_unique<DeviceLikeArena>(arena_bytes);
    }
    auto backend = std::make_unique<RecordingBackend>(
        HostKvBackendOptions{.layout = {options_.geometry, *codecs::FindCodec("int8_kivi")},
                             .num_q_heads = 3,
                             .scale = 0.125f},
        host_t0, &log_);
    backend_ = backend.get();
    auto store = TieredKvStore::Create(
        options_, {arena_.get(), rig_.ddr.get(), rig_.compressed.get()}, std::move(backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void Append(uint32_t n) {
    const size_t row = options_.geometry.ValuesPerTokenLayer();
    for (uint32_t layer = 0; layer < options_.geometry.num_layers; ++layer) {
      auto k = RandomVector(rng_, n * row), v = RandomVector(rng_, n * row);
      ASSERT_TRUE(store_->Append(layer, k.data(), v.data(), n).ok());
    }
  }
  std::vector<float> Read(uint32_t page) {
    std::vector<float> out(options_.geometry.PageBytes(0) / 4);
    EXPECT_TRUE(store_->ReadPage(0, page, out.data()).ok());
    return out;
  }
  uint64_t PageBytes() const { return options_.geometry.PageBytes(0); }
  uint64_t Slot(uint32_t i) const { return (PageBytes() + 4095) / 4096 * 4096 * i; }

  Rig rig_;
  std::mt19937 rng_{5};
  TieredKvStoreOptions options_;
  std::unique_ptr<DeviceArena> arena_;
  std::vector<std::string> log_;
  RecordingBackend* backend_ = nullptr;
  std::unique_ptr<TieredKvStore> store_;
};

TEST_F(FencedStoreTest, DemotedBlockIsNotReusedBeforeItsCopyCompletes) {
  Make(/*host_t0=*/false);
  Append(8);  // pages 0 and 1, full
  const uint64_t used = arena_->used_bytes();
  const std::vector<float> page0 = Read(0);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  // The copy out of page 0's block has not landed: the block stays allocated.
  EXPECT_EQ(arena_->used_bytes(), used);
  Append(4);  // page 2: must not get page 0's block
  EXPECT_EQ(arena_->used_bytes(), used + PageBytes());
  backend_->LandAll();
  Append(4);  // page 3: the fence is polled and the block recycled first
  EXPECT_EQ(arena_->used_bytes(), used + PageBytes());
  EXPECT_EQ(Read(0), page0);
}

TEST_F(FencedStoreTest, ReleasedSlotIsReportedOnlyAfterItsCopyLanded) {
  Make(/*host_t0=*/false);
  Append(8);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  log_.clear();
  std::vector<ReleasedSlot> released;
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT1, Tier::kT0}}, {{0}}, &released).ok());
  // The promotion's copy was issued, then waited for, and only then was its source reported.
  ASSERT_THAT(log_, ElementsAre("copy T1->T0 #2", "wait 2"));
  EXPECT_TRUE(backend_->Completed(2));
  EXPECT_THAT(released, ElementsAre(ReleasedSlot{PoolKind::kDdr, Slot(0)}));
}

TEST_F(FencedStoreTest, PlanAppliedWithoutCollectingReleasesStillWaitsForItsSourceCopies) {
  Make(/*host_t0=*/false);
  Append(8);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  log_.clear();
  // What a daemon plan does: no `released`, and the ack goes out when ApplyPlan returns.
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT1, Tier::kT0}}, {{0}}).ok());
  ASSERT_THAT(log_, ElementsAre("copy T1->T0 #2", "wait 2"));
  EXPECT_TRUE(backend_->Completed(2));
}

TEST_F(FencedStoreTest, PageBeingWrittenStaysInT0OnADeviceBackend) {
  Make(/*host_t0=*/false);
  Append(6);  // page 1 is partial
  for (Tier to : {Tier::kT1, Tier::kT2, Tier::kT3}) {
    absl::Status s = store_->ApplyPlan({{0, 1, Tier::kT0, to}}, {{Slot(0)}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << Name(to);
    EXPECT_THAT(std::string(s.message()), HasSubstr("stays in T0"));
  }
  EXPECT_THAT(log_, IsEmpty());
  EXPECT_EQ(store_->TierOf(0, 1), Tier::kT0);
}

TEST_F(FencedStoreTest, HostBackendStillMovesThePartialPageToT1AndAppendsThere) {
  Make(/*host_t0=*/true);
  Append(6);
  ASSERT_TRUE(store_->ApplyPlan({{0, 1, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  backend_->LandAll();
  Append(1);
  EXPECT_EQ(store_->TierOf(0, 1), Tier::kT1);
  EXPECT_EQ(store_->Length(0), 7u);
}

TEST_F(FencedStoreTest, DemotionsBeforePromotionsAreIssuedInPlanOrderWithinTheArena) {
  Make(/*host_t0=*/false, /*arena_bytes=*/0);  // replaced below
  // An arena that holds exactly two pages.
  arena_ = std::make_unique<DeviceLikeArena>(2 * options_.geometry.PageBytes(0));
  log_.clear();
  auto backend = std::make_unique<RecordingBackend>(
      HostKvBackendOptions{.layout = {options_.geometry, *codecs::FindCodec("int8_kivi")},
                           .num_q_heads = 3,
                           .scale = 0.125f},
      false, &log_);
  backend_ = backend.get();
  store_ = *TieredKvStore::Create(options_, {arena_.get(), rig_.ddr.get(), rig_.compressed.get()},
                                  std::move(backend));
  Append(8);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  backend_->LandAll();
  Append(4);  // page 2 takes the freed block: the arena is full again
  log_.clear();
  // Promotion first would overflow at that point of the plan: refused before any copy.
  const std::vector<Move> bad = {{0, 0, Tier::kT1, Tier::kT0}, {0, 1, Tier::kT0, Tier::kT1}};
  absl::Status s = store_->ApplyPlan(bad, {{0}, {Slot(1)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(log_, IsEmpty());
  // Demotion first fits: issued in that order; the promotion waits for the demoted block.
  const std::vector<Move> good = {{0, 1, Tier::kT0, Tier::kT1}, {0, 0, Tier::kT1, Tier::kT0}};
  std::vector<ReleasedSlot> released;
  ASSERT_TRUE(store_->ApplyPlan(good, {{Slot(1)}, {0}}, &released).ok());
  EXPECT_THAT(log_, ElementsAre("copy T0->T1 #2", "wait 2", "copy T1->T0 #3", "wait 3"));
  EXPECT_THAT(released, ElementsAre(ReleasedSlot{PoolKind::kDdr, Slot(0)}));
}

TEST_F(FencedStoreTest, PlanNamingAPageTheArenaDoesNotHoldIsRefusedBeforeAnyCopy) {
  Make(/*host_t0=*/false);
  Append(8);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  backend_->LandAll();
  log_.clear();
  // moves[0] is fine; moves[1] claims page 0 is in T0, page 7 does not exist.
  for (const Move& wrong : {Move{0, 0, Tier::kT0, Tier::kT2}, Move{0, 7, Tier::kT0, Tier::kT1}}) {
    absl::Status s =
        store_->ApplyPlan({{0, 1, Tier::kT0, Tier::kT1}, wrong}, {{Slot(1)}, {Slot(2)}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("moves[1]"));
  }
  EXPECT_THAT(log_, IsEmpty());
  EXPECT_EQ(store_->TierOf(0, 1), Tier::kT0);
}

TEST_F(FencedStoreTest, DestructionWaitsForCopiesStillReadingTheStoresMemory) {
  Make(/*host_t0=*/false);
  Append(8);
  ASSERT_TRUE(store_->ApplyPlan({{0, 0, Tier::kT0, Tier::kT1}}, {{Slot(0)}}).ok());
  const CopyToken pending = backend_->issued();
  EXPECT_FALSE(backend_->Completed(pending));
  log_.clear();
  store_.reset();
  EXPECT_THAT(log_, ElementsAre(absl::StrCat("wait ", pending)));
  EXPECT_EQ(arena_->used_bytes(), 0u);
}

TEST_F(FencedStoreTest, DeviceBackendRefusesTheKeepMask) {
  options_.geometry = testing::SmolLmGeometry(4);
  options_.num_q_heads = 3;
  options_.keep_mask = true;
  DeviceLikeArena arena(1 << 20);
  auto s = TieredKvStore::Create(
      options_, {&arena, nullptr, nullptr},
      std::make_unique<RecordingBackend>(
          HostKvBackendOptions{.layout = {options_.geometry, *codecs::FindCodec("int8_kivi")},
                               .num_q_heads = 3,
                               .scale = 0.125f},
          false, &log_));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("keep_mask"));
}

}  // namespace
}  // namespace kvtier::worker
