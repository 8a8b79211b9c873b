#ifndef KVTIER_WORKER_CUDA_SHM_REGION_H_
#define KVTIER_WORKER_CUDA_SHM_REGION_H_

// A POSIX shared-memory region (shm_open + ftruncate + mmap), the way the daemon's pools are
// mapped by a worker: used by the GPU bench and tests to measure copies from a real shared
// mapping. No CUDA. Move-only RAII: unmaps, and unlinks the name when it created it.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::worker::cuda {

// Thread-compatible.
class ShmRegion {
 public:
  // Creates `name` (must start with '/', must not exist) of `bytes` and maps it read-write.
  // The memory is reserved up front. INVALID_ARGUMENT for a bad name or 0 bytes; ALREADY_EXISTS;
  // RESOURCE_EXHAUSTED when /dev/shm has not that much room; INTERNAL for other errors.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(const std::string& name, uint64_t bytes);
  // An anonymous shared mapping (MAP_SHARED | MAP_ANONYMOUS) of `bytes`: the fallback where
  // /dev/shm is too small. name() is empty.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> CreateAnonymous(uint64_t bytes);
  // Maps an existing region read-write. NOT_FOUND when it does not exist.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Open(const std::string& name);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmRegion(std::string name, uint8_t* data, uint64_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}
  std::string name_;
  uint8_t* data_;
  uint64_t size_;
  bool owner_;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_SHM_REGION_H_
