#include "worker/cuda/sim/device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "worker/cuda/sim/cuda_runtime_sim.h"

namespace kvtier::cudasim {
namespace {

constexpr uint64_t kAlign = 256;
constexpr uint8_t kPoison = 0xFF;   // NaN as f32 and as bf16
constexpr uint8_t kRedZone = 0xA5;  // the bytes between an allocation's end and its guard page
// Allocations up to this size are poisoned whole; larger ones (arenas) only at both ends, so a
// 256 MiB arena costs no memory until it is used.
constexpr uint64_t kPoisonWhole = 16ull << 20;
constexpr uint64_t kPoisonEnds = 1ull << 20;
// Freed mappings stay PROT_NONE (use after free faults) until this much address space waits.
constexpr uint64_t kQuarantineBytes = 64ull << 30;

uint64_t PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}
uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t CapacityBytes() {
  static const uint64_t cap = [] {
    const char* env = std::getenv("KVTIER_CUDA_SIM_HBM_BYTES");
    return env != nullptr ? std::strtoull(env, nullptr, 10) : 16ull << 30;
  }();
  return cap;
}

struct Block {
  uint64_t bytes = 0;
  MemoryKind kind = MemoryKind::kDevice;
  uint8_t* map = nullptr;  // the whole mapping (guard pages included); null for registered
  uint64_t map_bytes = 0;
};

struct Table {
  std::mutex mu;
  std::map<uintptr_t, Block> blocks;  // by base
  uint64_t device_bytes = 0;          // live cudaMalloc bytes
  std::deque<std::pair<uint8_t*, uint64_t>> quarantine;
  uint64_t quarantine_bytes = 0;
};
Table& table() {
  static Table* t = new Table;  // outlives static destructors of users
  return *t;
}

// The block containing p, or end(). Caller holds mu.
std::map<uintptr_t, Block>::iterator Find(Table& t, uintptr_t p) {
  auto it = t.blocks.upper_bound(p);
  if (it == t.blocks.begin()) return t.blocks.end();
  --it;
  return p < it->first + std::max<uint64_t>(it->second.bytes, 1) ? it : t.blocks.end();
}

bool Overlaps(Table& t, uintptr_t p, uint64_t n) {
  auto it = t.blocks.lower_bound(p);
  if (it != t.blocks.end() && it->first < p + n) return true;
  if (it == t.blocks.begin()) return false;
  --it;
  return it->first + it->second.bytes > p;
}

// Whether every page of [p, p + n) is mapped with read and write permission (/proc/self/maps;
// a PROT_NONE reservation is mapped but cannot be pinned).
bool MappedReadWrite(uintptr_t p, uint64_t n) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t covered = p;
  const uintptr_t end = p + n;
  while (covered < end && std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    const size_t dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (hi <= covered) continue;
    if (lo > covered) return false;  // a hole
    if (perms.size() < 2 || perms[0] != 'r' || perms[1] != 'w') return false;
    covered = hi;
  }
  return covered >= end;
}

void Retire(Table& t, uint8_t* map, uint64_t map_bytes) {
  mprotect(map, map_bytes, PROT_NONE);
  madvise(map, map_bytes, MADV_DONTNEED);
  t.quarantine.emplace_back(map, map_bytes);
  t.quarantine_bytes += map_bytes;
  while (t.quarantine_bytes > kQuarantineBytes) {
    munmap(t.quarantine.front().first, t.quarantine.front().second);
    t.quarantine_bytes -= t.quarantine.front().second;
    t.quarantine.pop_front();
  }
}

const char* KindName(MemoryKind k) {
  switch (k) {
    case MemoryKind::kDevice:
      return "device allocation (cudaMalloc)";
    case MemoryKind::kPinnedHost:
      return "pinned host allocation (cudaMallocHost)";
    case MemoryKind::kRegistered:
      return "registered host range";
    default:
      return "pageable host memory";
  }
}

}  // namespace

bool Range::Contains(const void* p, uint64_t n) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a >= base && n <= bytes && a - base <= bytes - n;
}

Range Lookup(const void* p) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = Find(t, reinterpret_cast<uintptr_t>(p));
  if (it == t.blocks.end()) return {};
  return {it->second.kind, it->first, it->second.bytes};
}

bool DeviceAccessible(const void* p, uint64_t n) {
  if (n == 0) return true;
  const Range r = Lookup(p);
  return r.kind != MemoryKind::kPageable && r.Contains(p, n);
}

void* AllocateGuarded(uint64_t bytes, MemoryKind kind) {
  Table& t = table();
  const uint64_t page = PageBytes();
  const uint64_t body = RoundUp(RoundUp(bytes, kAlign), page);
  const uint64_t map_bytes = body + 2 * page;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (kind == MemoryKind::kDevice && t.device_bytes + bytes > CapacityBytes()) return nullptr;
  }
  void* m = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  uint8_t* map = static_cast<uint8_t*>(m);
  if (mprotect(map + page, body, PROT_READ | PROT_WRITE) != 0) {
    munmap(map, map_bytes);
    return nullptr;
  }
  // The allocation ends as close to the trailing guard page as 256-byte alignment allows.
  uint8_t* p = map + page + body - RoundUp(bytes, kAlign);
  if (bytes <= kPoisonWhole) {
    std::memset(p, kPoison, bytes);
  } else {
    std::memset(p, kPoison, kPoisonEnds);
    std::memset(p + bytes - kPoisonEnds, kPoison, kPoisonEnds);
  }
  std::memset(p + bytes, kRedZone, RoundUp(bytes, kAlign) - bytes);
  std::lock_guard<std::mutex> lock(t.mu);
  t.blocks[reinterpret_cast<uintptr_t>(p)] = {bytes, kind, map, map_bytes};
  if (kind == MemoryKind::kDevice) t.device_bytes += bytes;
  return p;
}

bool FreeGuarded(void* ptr, MemoryKind kind) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == t.blocks.end() || it->second.kind != kind) return false;
  const Block b = it->second;
  const uint8_t* p = static_cast<const uint8_t*>(ptr);
  for (uint64_t i = b.bytes; i < RoundUp(b.bytes, kAlign); ++i) {
    if (p[i] != kRedZone) {
      std::fprintf(stderr,
                   "kvtier CUDA simulation: %s at %p of %llu bytes was written %llu bytes past "
                   "its end\n",
                   KindName(kind), ptr, static_cast<unsigned long long>(b.bytes),
                   static_cast<unsigned long long>(i - b.bytes));
      std::abort();
    }
  }
  t.blocks.erase(it);
  if (kind == MemoryKind::kDevice) t.device_bytes -= b.bytes;
  Retire(t, b.map, b.map_bytes);
  return true;
}

int RegisterHost(void* ptr, uint64_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || bytes == 0) return cudaErrorInvalidValue;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (Overlaps(t, p, bytes)) return cudaErrorHostMemoryAlreadyRegistered;
  if (!MappedReadWrite(p, bytes)) return cudaErrorInvalidValue;
  t.blocks[p] = {bytes, MemoryKind::kRegistered, nullptr, 0};
  return cudaSuccess;
}

int UnregisterHost(void* ptr) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == t.blocks.end() || it->second.kind != MemoryKind::kRegistered) {
    return cudaErrorHostMemoryNotRegistered;
  }
  t.blocks.erase(it);
  return cudaSuccess;
}

}  // namespace kvtier::cudasim
