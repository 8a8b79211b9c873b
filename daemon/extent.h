#ifndef KVTIER_DAEMON_EXTENT_H_
#define KVTIER_DAEMON_EXTENT_H_

// Pool memory as the daemon hands it out: unnamed segments (memfd, or O_TMPFILE files in a
// configured tmpfs directory) or CUDA VMM pinned host allocations exported as POSIX descriptors
// (edge/cuda_vmm.h), which only holders of their descriptors can map. Nothing is ever
// reachable by name. The daemon itself never maps extents; it only creates, passes and closes
// them. Memory stays alive while any process maps it, so memory a lost worker may still read is
// never handed to anyone else: a new grant is always a new segment.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/layout/shm_abi.h"
#include "edge/cuda_driver.h"
#include "edge/memory_channel.h"

namespace kvtier::daemon {

// What an extent's descriptor is (the wire's v1::PoolMemory).
enum class ExtentMemory { kMemfd, kCudaVmm };

// How a pool's extents are made. The driver must outlive the source's use (not the extents:
// a descriptor keeps its memory alive without it).
struct ExtentSource {
  ExtentMemory memory = ExtentMemory::kMemfd;
  std::string dir;                           // kMemfd: as in Extent::Create
  const edge::cuda::Driver* cuda = nullptr;  // kCudaVmm
  int numa_node = 0;                         // kCudaVmm: where the memory is pinned
};

// One segment and its descriptor. Move-only; closing the descriptor is all destruction does.
class Extent {
 public:
  // A segment of `bytes`, fully reserved now (fallocate), so that a short tmpfs is
  // RESOURCE_EXHAUSTED here and never a SIGBUS in a worker later. `dir` empty: memfd (sealed
  // against shrinking and growing); otherwise an unnamed file in that directory.
  static absl::StatusOr<Extent> Create(const std::string& label, uint64_t bytes,
                                       const std::string& dir);
  // An extent of `bytes` from `source`: as Create for memfd; for CUDA VMM a pinned host
  // allocation exported as a POSIX descriptor (RESOURCE_EXHAUSTED when the host cannot pin it).
  static absl::StatusOr<Extent> Make(const std::string& label, uint64_t bytes,
                                     const ExtentSource& source);
  // A one-page segment holding `header`, sealed so that nobody (the daemon included) can write,
  // shrink or grow it again: workers map it read-only.
  static absl::StatusOr<Extent> CreateSealedHeader(const std::string& label,
                                                   const layout::PoolHeader& header);

  Extent(Extent&&) = default;
  Extent& operator=(Extent&&) = default;

  // A descriptor of this extent for a worker. Memfd and O_TMPFILE extents: a fresh open of the
  // file (its own open file description, which OthersHold can see for as long as any process
  // keeps it open or mapped, forks and relays included); CUDA VMM: a duplicate. INTERNAL when
  // the file cannot be reopened (never a duplicate then: one would be invisible to OthersHold).
  absl::StatusOr<edge::UniqueFd> Share() const;
  // Whether any process other than the daemon still holds this extent, by the kernel's word: a
  // write lease (F_SETLEASE) is granted only while the daemon's own is the file's sole open file
  // description. kUnknown where the kernel cannot say (CUDA VMM descriptors, leases disabled).
  enum class Holders { kNone, kSome, kUnknown };
  Holders OthersHold() const;

  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return bytes_; }
  ExtentMemory memory() const { return memory_; }

 private:
  Extent(edge::UniqueFd fd, uint64_t bytes, ExtentMemory memory = ExtentMemory::kMemfd)
      : fd_(std::move(fd)), bytes_(bytes), memory_(memory) {}
  edge::UniqueFd fd_;
  uint64_t bytes_ = 0;
  ExtentMemory memory_ = ExtentMemory::kMemfd;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_EXTENT_H_
