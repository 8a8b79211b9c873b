#ifndef KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_
#define KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_

// Private to the client library: a worker's memory of one pool as a reserved address range
// (PROT_NONE) into which extents received over the memory channel are mapped MAP_FIXED, extent
// i at i * extent_bytes; the pool's sealed header is mapped read-only and checked once.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvtier/client.h"

namespace kvtier::internal {

// Thread-safe: Grow serializes on its own mutex; data() is fixed for the object's life.
class ExtentMapping final : public PoolMapping {
 public:
  // Reserves the range a registration's descriptor names.
  static absl::StatusOr<std::shared_ptr<ExtentMapping>> Reserve(const v1::PoolDescriptor& d,
                                                                uint64_t worker_id, uint64_t epoch);
  ~ExtentMapping() override;

  v1::PoolKind kind() const override { return kind_; }
  uint8_t* data() const override { return base_; }
  uint64_t data_bytes() const override { return extent_bytes_ * max_extents_; }
  uint64_t epoch() const override { return epoch_; }
  uint32_t mapped_extents() const override { return mapped_.load(std::memory_order_acquire); }

  // Maps extents until `n` are mapped, fetching the missing ones from the channel at
  // `channel_path` with the session's credentials; the first fetch checks the header.
  absl::Status Grow(uint32_t n, const std::string& channel_path, const std::string& secret);

 private:
  ExtentMapping(v1::PoolKind kind, uint8_t* base, uint64_t extent_bytes, uint64_t max_extents,
                uint64_t worker_id, uint64_t epoch)
      : kind_(kind),
        base_(base),
        extent_bytes_(extent_bytes),
        max_extents_(max_extents),
        worker_id_(worker_id),
        epoch_(epoch) {}

  const v1::PoolKind kind_;
  uint8_t* const base_;
  const uint64_t extent_bytes_, max_extents_, worker_id_, epoch_;
  absl::Mutex mu_;
  bool header_checked_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint32_t> mapped_{0};
};

}  // namespace kvtier::internal

#endif  // KVTIER_CLIENT_LIB_EXTENT_MAPPING_H_
