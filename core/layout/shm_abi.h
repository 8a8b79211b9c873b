#ifndef KVTIER_CORE_LAYOUT_SHM_ABI_H_
#define KVTIER_CORE_LAYOUT_SHM_ABI_H_

// The shared-memory ABI between kvtierd and its workers: a versioned POD header at offset 0 of
// every pool segment. Offsets, never pointers, since each process maps the segment at its own
// address. docs/shm-abi.md describes the layout; any change to it bumps kPoolAbiVersion.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"

namespace kvtier::layout {

inline constexpr uint32_t kPoolMagic = 0x5054564B;  // "KVTP" little-endian
inline constexpr uint32_t kPoolAbiVersion = 1;
// Slot data starts at this offset, aligned for DMA and huge pages alike.
inline constexpr uint64_t kPoolDataOffset = 4096;
// Slots are carved at this granularity; every slot offset is a multiple of it.
inline constexpr uint64_t kSlotAlignment = 256;

enum class PoolKind : uint32_t {
  kDdr = 1,         // T1: full-precision pages
  kCompressed = 2,  // T2: 8-bit pages with their scales
};

struct PoolHeader {
  uint32_t magic;         // kPoolMagic
  uint32_t abi_version;   // kPoolAbiVersion
  uint32_t kind;          // PoolKind
  uint32_t header_bytes;  // sizeof(PoolHeader) when written
  uint64_t total_bytes;   // size of the whole segment
  uint64_t data_offset;   // first byte of slot data (kPoolDataOffset)
  uint64_t data_bytes;    // bytes usable for slots
  uint64_t daemon_epoch;  // changes on every daemon start; workers re-register when it differs
  uint64_t created_unix_ns;
  uint8_t reserved[64];
};

static_assert(std::is_standard_layout_v<PoolHeader>);
static_assert(std::is_trivially_copyable_v<PoolHeader>);
static_assert(sizeof(PoolHeader) == 120);
static_assert(offsetof(PoolHeader, kind) == 8);
static_assert(offsetof(PoolHeader, total_bytes) == 16);
static_assert(offsetof(PoolHeader, data_offset) == 24);
static_assert(offsetof(PoolHeader, daemon_epoch) == 40);
static_assert(sizeof(PoolHeader) <= kPoolDataOffset);

// A header for a new segment of `total_bytes`.
PoolHeader MakePoolHeader(PoolKind kind, uint64_t total_bytes, uint64_t daemon_epoch,
                          uint64_t created_unix_ns);

// Checks a mapped header: magic, version, kind and sizes against the mapping's size.
// FAILED_PRECONDITION (with the bad field and value) when the segment is not usable.
absl::Status ValidatePoolHeader(const PoolHeader& header, PoolKind expected_kind,
                                uint64_t mapped_bytes);

}  // namespace kvtier::layout

#endif  // KVTIER_CORE_LAYOUT_SHM_ABI_H_
