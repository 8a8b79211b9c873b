// Pinning a daemon pool per mapped extent (worker/cuda/pin_ledger.h) over a real reservation laid
// out as the client lays it (PROT_NONE range, memfd extents MAP_FIXED into it), with a
// registration that refuses what the driver refuses: a range not wholly mapped read-write. And
// the registry of pin records: keyed by the memory's owner, unpinned before the owner unmaps, a
// reused address finding no old record.

#include "worker/cuda/pin_ledger.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::worker::cuda {
namespace {

using ::testing::HasSubstr;
constexpr uint64_t kMiB = 1 << 20;

// Whether [p, p + n) is covered by read-write mappings (/proc/self/maps), as cudaHostRegister
// needs.
bool MappedReadWrite(const uint8_t* p, uint64_t n) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t want = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = want + n;
  std::vector<std::tuple<uintptr_t, uintptr_t, bool>> areas;
  while (std::getline(maps, line)) {
    uintptr_t a = 0, b = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &a, &b, perms) != 3) continue;
    areas.emplace_back(a, b, perms[0] == 'r' && perms[1] == 'w');
  }
  std::sort(areas.begin(), areas.end());
  for (const auto& [a, b, rw] : areas) {
    if (b <= want || a > want) continue;
    if (!rw) return false;
    want = b;
    if (want >= end) return true;
  }
  return false;
}

// A pool as ExtentMapping makes it: `max_extents` × `extent` reserved PROT_NONE, extents mapped
// from the front on demand.
class Reservation {
 public:
  Reservation(uint64_t extent, uint64_t max_extents) : extent_(extent), max_(max_extents) {
    void* p = mmap(nullptr, extent * max_extents, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Reservation() {
    if (base_ != nullptr) munmap(base_, extent_ * max_);
  }
  bool MapNext() {
    const int fd = memfd_create("pin-ledger-test", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, extent_) != 0) return false;
    void* got = mmap(base_ + mapped_ * extent_, extent_, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (got == MAP_FAILED) return false;
    ++mapped_;
    return true;
  }
  uint8_t* base() const { return base_; }
  uint64_t size() const { return extent_ * max_; }
  uint64_t mapped_bytes() const { return mapped_ * extent_; }

 private:
  const uint64_t extent_, max_;
  uint8_t* base_ = nullptr;
  uint64_t mapped_ = 0;
};

struct Recorder {
  std::vector<std::pair<uint64_t, uint64_t>> pinned;  // live registrations
  int refused = 0, unpinned = 0;
};

PinHooks Hooks(Reservation& r, Recorder& rec) {
  return {.pin =
              [&r, &rec](uint64_t offset, uint64_t bytes) {
                if (!MappedReadWrite(r.base() + offset, bytes)) {
                  ++rec.refused;
                  return absl::InvalidArgumentError("cudaHostRegister: invalid argument");
                }
                rec.pinned.emplace_back(offset, bytes);
                return absl::OkStatus();
              },
          .unpin =
              [&rec](uint64_t offset) {
                auto it = std::find_if(rec.pinned.begin(), rec.pinned.end(),
                                       [&](const auto& p) { return p.first == offset; });
                ASSERT_NE(it, rec.pinned.end()) << "unpinning what was not pinned: " << offset;
                rec.pinned.erase(it);
                ++rec.unpinned;
              },
          .mapped_bytes = [&r] { return r.mapped_bytes(); }};
}

// The daemon-mode case of the issue: 256 MiB chunks over a mostly unmapped pool of 12 MiB
// extents. Pinning a chunk would cover PROT_NONE memory, which the driver refuses.
TEST(PinLedgerTest, PinsOnlyInsideMappedExtentsOfAMostlyUnmappedPool) {
  Reservation r(12 * kMiB, 32);  // 384 MiB reserved
  ASSERT_NE(r.base(), nullptr);
  ASSERT_TRUE(r.MapNext() && r.MapNext() && r.MapNext());
  Recorder rec;
  auto ledger = PinLedger::Create(r.size(), 12 * kMiB, 256 * kMiB, Hooks(r, rec), false);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ((*ledger)->unit_bytes(), 12 * kMiB);
  ASSERT_TRUE((*ledger)->EnsurePinned(25 * kMiB, 4096).ok());  // in extent 2
  ASSERT_EQ(rec.pinned.size(), 1u);
  EXPECT_EQ(rec.pinned[0], std::make_pair(24 * kMiB, 12 * kMiB));
  ASSERT_TRUE((*ledger)->EnsurePinned(11 * kMiB, 2 * kMiB).ok());  // extents 0 and 1
  EXPECT_EQ((*ledger)->pinned_bytes(), 36 * kMiB);
  // Extent 3 is not mapped: refused before the driver is asked.
  const absl::Status s = (*ledger)->EnsurePinned(36 * kMiB, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("3 mapped extents"));
  EXPECT_EQ(rec.refused, 0);
  ASSERT_TRUE(r.MapNext());  // the daemon grants extent 3
  EXPECT_TRUE((*ledger)->EnsurePinned(36 * kMiB, 4096).ok());
  ledger->reset();
  EXPECT_TRUE(rec.pinned.empty()) << "everything pinned is unpinned";
  EXPECT_EQ(rec.unpinned, 4);
}

// Any extent the configuration allows and any chunk: every registration lies in one mapped
// extent, units tile the grid copies are cut at, and what is pinned reads back as pinned.
TEST(PinLedgerTest, RandomExtentsChunksAndRangesRegisterOnlyMappedWholeUnits) {
  std::mt19937_64 rng(32);
  for (int round = 0; round < 16; ++round) {
    const uint64_t extent = (1 + rng() % 24) * kMiB;
    const uint64_t max_extents = 2 + rng() % 10;
    const uint64_t chunk = (1 + rng() % 64) * 4096 * (rng() % 2 ? 1 : 256);
    Reservation r(extent, max_extents);
    ASSERT_NE(r.base(), nullptr);
    const uint64_t mapped = 1 + rng() % max_extents;
    for (uint64_t i = 0; i < mapped; ++i) ASSERT_TRUE(r.MapNext());
    Recorder rec;
    auto ledger = PinLedger::Create(r.size(), extent, chunk, Hooks(r, rec), false);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    const uint64_t unit = (*ledger)->unit_bytes();
    ASSERT_LE(unit, chunk);
    ASSERT_EQ(extent % unit, 0u) << extent << " " << chunk;
    for (int i = 0; i < 30; ++i) {
      const uint64_t offset = rng() % r.size();
      const uint64_t bytes = 1 + rng() % std::min<uint64_t>(3 * extent, r.size() - offset);
      const absl::Status s = (*ledger)->EnsurePinned(offset, bytes);
      if (offset + bytes <= r.mapped_bytes()) {
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_TRUE((*ledger)->IsPinned(offset, bytes));
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      }
    }
    EXPECT_EQ(rec.refused, 0) << "a registration the driver would refuse was attempted";
    for (const auto& [offset, bytes] : rec.pinned) {
      EXPECT_EQ(offset / extent, (offset + bytes - 1) / extent) << "spans two extents";
      EXPECT_EQ(offset % unit, 0u);
    }
    ledger->reset();
    EXPECT_TRUE(rec.pinned.empty());
  }
}

TEST(PinLedgerTest, UnitsAndErrors) {
  EXPECT_EQ(*PinUnitBytes(1000 * 4096, 1000 * 4096, 256 * 4096), 256u * 4096);  // local pool
  EXPECT_EQ(*PinUnitBytes(96 * kMiB, 12 * kMiB, 256 * kMiB), 12 * kMiB);
  EXPECT_EQ(*PinUnitBytes(3 * 768 * kMiB, 768 * kMiB, 256 * kMiB), 256 * kMiB);
  EXPECT_EQ(*PinUnitBytes(2 * 300 * kMiB, 300 * kMiB, 256 * kMiB), 150 * kMiB);
  EXPECT_EQ(PinUnitBytes(0, 4096, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PinUnitBytes(8192, 4096, 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PinUnitBytes(3 * kMiB, 2 * kMiB, 4096).status().message(),
              HasSubstr("extent_bytes 2097152"));
  auto borrowed = PinLedger::Create(8 * kMiB, 2 * kMiB, kMiB, {}, true);
  ASSERT_TRUE(borrowed.ok());
  EXPECT_TRUE((*borrowed)->EnsurePinned(0, 8 * kMiB).ok()) << "borrowed: nothing registered";
  EXPECT_TRUE((*borrowed)->IsPinned(0, 8 * kMiB));
  EXPECT_EQ((*borrowed)->EnsurePinned(8 * kMiB, 1).code(), absl::StatusCode::kOutOfRange);
}

// A record that logs its unpinning, over an owner that logs its unmapping.
struct Record {
  Record(std::shared_ptr<const void> o, std::vector<std::string>* l, std::string n)
      : owner(std::move(o)), log(l), name(std::move(n)) {}
  Record(const Record&) = delete;
  std::shared_ptr<const void> owner;
  std::vector<std::string>* log;
  std::string name;
  ~Record() { log->push_back("unpin " + name); }
};

TEST(PinRegistryTest, ARecordIsUnpinnedBeforeItsMemoryIsUnmappedAndAReusedKeyStartsAfresh) {
  std::vector<std::string> log;
  PinRegistry<Record> registry;
  int made = 0;
  auto make = [&](std::shared_ptr<const void> owner, std::string name) {
    return [&, owner, name]() -> absl::StatusOr<std::unique_ptr<Record>> {
      ++made;
      return std::make_unique<Record>(owner, &log, name);
    };
  };
  // An owner (the client's mapping) that logs when it unmaps.
  auto mapping = std::shared_ptr<int>(new int(1), [&log](int* p) {
    log.push_back("unmap");
    delete p;
  });
  const void* key = mapping.get();
  auto a = registry.For(key, make(mapping, "old"));
  auto a2 = registry.For(key, make(mapping, "old"));
  ASSERT_TRUE(a.ok() && a2.ok());
  EXPECT_EQ(a->get(), a2->get()) << "two stores over one pool share its record";
  EXPECT_EQ(made, 1);
  mapping.reset();  // the sequence dropped the old mapping (a rejoin): the record still holds it
  EXPECT_TRUE(log.empty()) << "unmapped while pinned";
  a->reset();
  a2->reset();
  EXPECT_EQ(log, (std::vector<std::string>{"unpin old", "unmap"}));
  EXPECT_EQ(registry.live(), 0u);
  // A new mapping at the same key (a reused address) gets a record of its own.
  auto b = registry.For(key, make(nullptr, "new"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(made, 2);
  EXPECT_EQ((*b)->name, "new");
  // A failed make keeps nothing.
  b->reset();
  auto failed = registry.For(key, [] {
    return absl::StatusOr<std::unique_ptr<Record>>(absl::InternalError("cannot pin"));
  });
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(registry.live(), 0u);
}

}  // namespace
}  // namespace kvtier::worker::cuda
