#ifndef KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_
#define KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_

// Private to the client library: a worker's memory of one pool as a reserved address range into
// which extents received over the memory channel are mapped, extent i at i * extent_bytes: memfd
// extents MAP_FIXED into a PROT_NONE reservation; CUDA VMM extents imported and cuMemMap'ed into
// a cuMemAddressReserve range, for the devices and the host (edge/cuda_vmm.h). The pool's sealed
// header (a memfd either way) is mapped read-only and checked once.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "edge/cuda_vmm.h"
#include "edge/daemon_identity.h"
#include "edge/memory_channel.h"
#include "kvtier/client.h"

namespace kvtier::internal {

// Thread-safe: Grow serializes on its own mutex; data() is fixed for the object's life.
class ExtentMapping final : public PoolMapping {
 public:
  // Reserves the range a registration's descriptor names. A CUDA VMM pool needs `cuda` (kept for
  // the mapping's life): FAILED_PRECONDITION naming the pool and the driver's error when it is
  // an error or null, or the range cannot be reserved.
  static absl::StatusOr<std::shared_ptr<ExtentMapping>> Reserve(
      const v1::PoolDescriptor& d, uint64_t worker_id, uint64_t epoch,
      absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>> cuda = nullptr);
  ~ExtentMapping() override;

  v1::PoolKind kind() const override { return kind_; }
  uint8_t* data() const override { return base_; }
  uint64_t data_bytes() const override { return extent_bytes_ * max_extents_; }
  uint64_t epoch() const override { return epoch_; }
  uint32_t mapped_extents() const override { return mapped_.load(std::memory_order_acquire); }
  uint64_t extent_bytes() const override { return extent_bytes_; }
  bool device_mapped() const override { return vmm_ != nullptr; }
  // Set once an extent of a CUDA VMM pool could not be imported or mapped (the error).
  std::string vmm_failure() const;

  // Maps extents until `n` are mapped, fetching the missing ones from the channel at
  // `channel_path` (answered by one of `daemon`) with the session's credentials; the first fetch
  // checks the header. Every descriptor of a reply is checked (type, size, seals) before any of
  // them is mapped: UNAUTHENTICATED naming the first that is not what the daemon makes.
  absl::Status Grow(uint32_t n, const std::string& channel_path, const std::string& secret,
                    const edge::DaemonUids& daemon);

 private:
  ExtentMapping(v1::PoolKind kind, uint8_t* base, uint64_t extent_bytes, uint64_t max_extents,
                uint64_t worker_id, uint64_t epoch, std::shared_ptr<const edge::cuda::Driver> cuda,
                std::unique_ptr<edge::cuda::VmmRange> vmm)
      : kind_(kind),
        base_(base),
        extent_bytes_(extent_bytes),
        max_extents_(max_extents),
        worker_id_(worker_id),
        epoch_(epoch),
        cuda_(std::move(cuda)),
        vmm_(std::move(vmm)) {}
  absl::Status CheckHeader(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Type, size and seals of a reply's descriptors: the header, then extents from `first`.
  absl::Status CheckDescriptors(const std::vector<edge::UniqueFd>& fds, uint32_t first) const;
  absl::Status MapExtent(int fd, uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::PoolKind kind_;
  uint8_t* const base_;
  const uint64_t extent_bytes_, max_extents_, worker_id_, epoch_;
  const std::shared_ptr<const edge::cuda::Driver> cuda_;                     // kept alive for vmm_
  const std::unique_ptr<edge::cuda::VmmRange> vmm_ ABSL_PT_GUARDED_BY(mu_);  // null: memfd
  mutable absl::Mutex mu_;
  bool header_checked_ ABSL_GUARDED_BY(mu_) = false;
  std::string vmm_failure_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> mapped_{0};
};

}  // namespace kvtier::internal

#endif  // KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_
