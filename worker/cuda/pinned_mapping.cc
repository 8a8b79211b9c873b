#include "worker/cuda/pinned_mapping.h"

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/pinning_plan.h"

namespace kvtier::worker::cuda {

absl::StatusOr<std::unique_ptr<PinnedMapping>> PinnedMapping::Create(uint8_t* base, uint64_t size,
                                                                     PinnedMappingOptions options) {
  if (base == nullptr) return absl::InvalidArgumentError("base is null");
  if (reinterpret_cast<uintptr_t>(base) % kHostPageBytes != 0) {
    return absl::InvalidArgumentError("base must be 4096-byte aligned");
  }
  std::unique_ptr<PinnedMapping> m(new PinnedMapping(base, std::move(options.owner)));
  PinHooks hooks{.pin = [base](uint64_t offset, uint64_t bytes) -> absl::Status {
                   KVTIER_CUDA_RETURN_IF_ERROR(cudaHostRegister(
                       base + offset, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
                   return absl::OkStatus();
                 },
                 .unpin =
                     [base](uint64_t offset) {
                       if (cudaHostUnregister(base + offset) != cudaSuccess) {
                         cudaGetLastError();  // handled here: not the next launch's error
                       }
                     },
                 .mapped_bytes = std::move(options.mapped_bytes)};
  absl::StatusOr<std::unique_ptr<PinLedger>> ledger =
      PinLedger::Create(size, options.extent_bytes == 0 ? size : options.extent_bytes,
                        options.chunk_bytes, std::move(hooks), options.already_pinned);
  if (!ledger.ok()) return ledger.status();
  m->ledger_ = *std::move(ledger);
  if (options.pin_all_now) {
    absl::Status s = m->PinAll();
    if (!s.ok()) return s;
  }
  return m;
}

absl::StatusOr<std::unique_ptr<PinnedMapping>> PinnedMapping::ForPool(
    const PagePool& pool, PinnedMappingOptions options) {
  options.already_pinned = options.already_pinned || pool.device_mapped();
  options.extent_bytes = pool.extent_bytes();
  options.mapped_bytes = pool.mapped_bytes_reader();
  options.owner = pool.memory_owner();
  return Create(pool.base(), pool.size(), std::move(options));
}

PinnedMapping::~PinnedMapping() = default;

}  // namespace kvtier::worker::cuda
