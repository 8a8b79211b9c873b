#ifndef KVTIER_CORE_LAYOUT_SHM_ABI_H_
#define KVTIER_CORE_LAYOUT_SHM_ABI_H_

// The memory ABI between kvtierd and its workers (docs/shm-abi.md). A worker's memory of one
// pool is a set of extents (unnamed memfd segments of extent_bytes each, passed as descriptors)
// plus one sealed header segment that no process can write once the daemon sealed it. Offsets,
// never pointers, since each process maps at its own address. Any change bumps kPoolAbiVersion.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"

namespace kvtier::layout {

inline constexpr uint32_t kPoolMagic = 0x5054564B;  // "KVTP" little-endian
// 1: one named POSIX shm segment per pool, shared by every worker. 2: per-worker extents.
inline constexpr uint32_t kPoolAbiVersion = 2;
// The header segment's size (one page).
inline constexpr uint64_t kPoolHeaderBytes = 4096;
// Slots are carved at this granularity; every slot offset is a multiple of it.
inline constexpr uint64_t kSlotAlignment = 256;
// Extent sizes are multiples of this (huge-page friendly).
inline constexpr uint64_t kExtentAlignment = 2ull << 20;

enum class PoolKind : uint32_t {
  kDdr = 1,         // T1: full-precision pages
  kCompressed = 2,  // T2: 8-bit pages with their scales
};

struct PoolHeader {
  uint32_t magic;         // kPoolMagic
  uint32_t abi_version;   // kPoolAbiVersion
  uint32_t kind;          // PoolKind
  uint32_t header_bytes;  // sizeof(PoolHeader) when written
  uint64_t extent_bytes;  // size of every extent of this worker's pool memory
  uint64_t max_extents;   // the most extents the worker can be given (its reserved range)
  uint64_t worker_id;     // the worker this memory belongs to
  uint64_t daemon_epoch;  // changes on every daemon start
  uint64_t created_unix_ns;
  uint8_t reserved[64];
};

static_assert(std::is_standard_layout_v<PoolHeader>);
static_assert(std::is_trivially_copyable_v<PoolHeader>);
static_assert(sizeof(PoolHeader) == 120);
static_assert(offsetof(PoolHeader, kind) == 8);
static_assert(offsetof(PoolHeader, extent_bytes) == 16);
static_assert(offsetof(PoolHeader, max_extents) == 24);
static_assert(offsetof(PoolHeader, worker_id) == 32);
static_assert(offsetof(PoolHeader, daemon_epoch) == 40);
static_assert(sizeof(PoolHeader) <= kPoolHeaderBytes);

// A header for a worker's memory of one pool.
PoolHeader MakePoolHeader(PoolKind kind, uint64_t extent_bytes, uint64_t max_extents,
                          uint64_t worker_id, uint64_t daemon_epoch, uint64_t created_unix_ns);

// Checks a mapped header against what the worker was told at registration: magic, version,
// kind, extent size and count, worker id. FAILED_PRECONDITION naming the bad field and value.
absl::Status ValidatePoolHeader(const PoolHeader& header, PoolKind expected_kind,
                                uint64_t extent_bytes, uint64_t max_extents, uint64_t worker_id);

}  // namespace kvtier::layout

#endif  // KVTIER_CORE_LAYOUT_SHM_ABI_H_
