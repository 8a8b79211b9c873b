#ifndef KVTIER_DAEMON_SHM_SEGMENT_H_
#define KVTIER_DAEMON_SHM_SEGMENT_H_

// A POSIX shared-memory segment holding one pool, with the versioned header of
// core/layout/shm_abi.h at offset 0. The daemon creates (and on destruction removes) the
// segments; workers and tests map them by name. Boost.Interprocess exceptions stop here and
// come out as absl::Status.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/layout/shm_abi.h"

namespace kvtier::daemon {

// Settings of a segment the daemon creates.
struct ShmSegmentOptions {
  std::string name;  // shm_open name, "/<prefix>-ddr-<epoch>"
  layout::PoolKind kind = layout::PoolKind::kDdr;
  uint64_t total_bytes = 0;   // whole segment, header included; > kPoolDataOffset
  uint32_t mode = 0660;       // permission bits of the segment
  std::string group;          // "" = the process's group; otherwise chown to this group
  uint64_t daemon_epoch = 0;  // written into the header
};

// One mapped segment. Move-only; the creator removes the name on destruction, a mapper only
// unmaps. Thread-compatible: the mapping itself may be shared, this object may not be mutated
// concurrently.
class ShmSegment {
 public:
  // Creates a new segment (fails with ALREADY_EXISTS if the name is taken), sizes it, applies
  // mode and group, maps it read-write and writes the pool header.
  static absl::StatusOr<ShmSegment> Create(const ShmSegmentOptions& options);
  // Maps an existing segment read-write and validates its header against `kind`. The segment is
  // not removed when the returned object goes away.
  static absl::StatusOr<ShmSegment> Open(const std::string& name, layout::PoolKind kind);

  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  // The mapping's first byte (the header). Null after a move.
  uint8_t* base() const { return base_; }
  const layout::PoolHeader& header() const {
    return *reinterpret_cast<const layout::PoolHeader*>(base_);
  }
  // Slot data: base() + header().data_offset, data_bytes() long.
  uint8_t* data() const { return base_ + layout::kPoolDataOffset; }
  uint64_t data_bytes() const { return size_ - layout::kPoolDataOffset; }
  bool owner() const { return owner_; }

 private:
  struct Mapping;  // Boost objects, kept out of this header.
  ShmSegment(std::unique_ptr<Mapping> mapping, std::string name, bool owner);
  void Reset();

  std::unique_ptr<Mapping> mapping_;
  std::string name_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool owner_ = false;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SHM_SEGMENT_H_
