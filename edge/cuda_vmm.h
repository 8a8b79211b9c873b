#ifndef KVTIER_EDGE_CUDA_VMM_H_
#define KVTIER_EDGE_CUDA_VMM_H_

// Pool memory as CUDA VMM host allocations (edge/cuda_driver.h): the daemon creates pinned
// host-NUMA allocations and exports each as a POSIX descriptor (it never maps them); a worker
// imports the descriptors into one reserved virtual range, mapped for its devices and the host
// at the same address, so the pool is pinned once for every process.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "edge/cuda_driver.h"
#include "edge/memory_channel.h"

namespace kvtier::edge::cuda {

// A pinned allocation of `bytes` on host NUMA node `numa_node`, exported as a POSIX descriptor.
// The driver's own handle is released before this returns: the descriptor keeps the memory alive
// (and so does every mapping of it). RESOURCE_EXHAUSTED when the host cannot pin that much.
absl::StatusOr<UniqueFd> CreateExportedHostAllocation(const Driver& driver, uint64_t bytes,
                                                      int numa_node);

// A worker's virtual range for one pool, into which exported allocations are mapped. Not
// thread-safe (the owner serializes); unmaps and frees the range on destruction. `driver` must
// outlive it.
class VmmRange {
 public:
  // Reserves `bytes` (a multiple of `alignment`, the extents' size, which need not be a power of
  // two: the range is aligned to the largest power of two dividing it) of device-and-host virtual
  // address space; every visible device, and the host NUMA node `numa_node`, get access to what
  // is mapped. A driver without host-NUMA VMM (before 12.2, or a device without it) is refused
  // here, before anything is reserved.
  static absl::StatusOr<std::unique_ptr<VmmRange>> Reserve(const Driver* driver, uint64_t bytes,
                                                           uint64_t alignment, int numa_node);
  ~VmmRange();
  VmmRange(const VmmRange&) = delete;
  VmmRange& operator=(const VmmRange&) = delete;

  // Imports the descriptor `fd` (which the caller still owns) and maps `bytes` of it at
  // `offset` in the range, readable and writable by the devices and the host. On failure nothing
  // of it stays imported or mapped, and the status names the step and the driver's error.
  absl::Status MapAt(int fd, uint64_t offset, uint64_t bytes);

  uint8_t* base() const { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(base_)); }
  uint64_t bytes() const { return bytes_; }

 private:
  VmmRange(const Driver* driver, DevicePtr base, uint64_t bytes, std::vector<MemAccessDesc> access)
      : driver_(driver), base_(base), bytes_(bytes), access_(std::move(access)) {}

  const Driver* const driver_;
  const DevicePtr base_;
  const uint64_t bytes_;
  const std::vector<MemAccessDesc> access_;
  std::vector<std::pair<uint64_t, uint64_t>> mapped_;  // (offset, bytes)
};

}  // namespace kvtier::edge::cuda

#endif  // KVTIER_EDGE_CUDA_VMM_H_
