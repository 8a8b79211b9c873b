#include "edge/cuda_vmm.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kvtier::edge::cuda {

absl::StatusOr<UniqueFd> CreateExportedHostAllocation(const Driver& driver, uint64_t bytes,
                                                      int numa_node) {
  const DriverApi& api = driver.api();
  const MemAllocationProp prop = HostNumaProp(numa_node);
  MemHandle handle = 0;
  if (absl::Status s = driver.Check(api.MemCreate(&handle, bytes, &prop, 0),
                                    absl::StrCat("cuMemCreate(", bytes >> 20,
                                                 " MiB pinned on host NUMA node ", numa_node, ")"));
      !s.ok()) {
    return s;
  }
  int fd = -1;
  absl::Status exported =
      driver.Check(api.MemExportToShareableHandle(&fd, handle, kHandlePosixFd, 0),
                   "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)");
  UniqueFd owned(exported.ok() ? fd : -1);
  absl::Status released = driver.Check(api.MemRelease(handle), "cuMemRelease");
  if (!exported.ok()) return exported;
  if (!released.ok()) return released;
  return owned;
}

absl::StatusOr<std::unique_ptr<VmmRange>> VmmRange::Reserve(const Driver* driver, uint64_t bytes,
                                                            uint64_t alignment, int numa_node) {
  if (bytes == 0 || alignment == 0 || bytes % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("VMM range of ", bytes, " bytes must be a positive multiple of ", alignment));
  }
  // The access list names a host-NUMA location, which a driver before 12.2 cannot map.
  if (absl::Status s = driver->CheckHostNumaVmm(); !s.ok()) return s;
  const int devices = driver->DeviceCount();
  std::vector<MemAccessDesc> access;
  for (int ordinal = 0; ordinal < devices; ++ordinal) {
    Device dev = 0;
    if (absl::Status s = driver->Check(driver->api().DeviceGet(&dev, ordinal),
                                       absl::StrCat("cuDeviceGet(", ordinal, ")"));
        !s.ok()) {
      return s;
    }
    access.push_back({{kLocationDevice, dev}, kAccessReadWrite});
  }
  access.push_back({{kLocationHostNuma, numa_node}, kAccessReadWrite});
  // The driver takes only power-of-two alignments, and extents need not be one (12 MiB is a
  // valid extent): the largest power of two dividing the extent size aligns every extent start.
  const uint64_t reserve_alignment = alignment & (~alignment + 1);
  DevicePtr base = 0;
  if (absl::Status s =
          driver->Check(driver->api().MemAddressReserve(&base, bytes, reserve_alignment, 0, 0),
                        absl::StrCat("cuMemAddressReserve(", bytes >> 20, " MiB)"));
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<VmmRange>(new VmmRange(driver, base, bytes, std::move(access)));
}

VmmRange::~VmmRange() {
  for (const auto& [offset, bytes] : mapped_) (void)driver_->api().MemUnmap(base_ + offset, bytes);
  (void)driver_->api().MemAddressFree(base_, bytes_);
}

absl::Status VmmRange::MapAt(int fd, uint64_t offset, uint64_t bytes) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("map ", bytes, " bytes at ", offset, " past the VMM range of ", bytes_));
  }
  const DriverApi& api = driver_->api();
  MemHandle handle = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  if (absl::Status s =
          driver_->Check(api.MemImportFromShareableHandle(&handle, os_handle, kHandlePosixFd),
                         "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)");
      !s.ok()) {
    return s;
  }
  const DevicePtr at = base_ + offset;
  absl::Status mapped = driver_->Check(api.MemMap(at, bytes, 0, handle, 0), "cuMemMap");
  // A mapping holds the allocation: the imported handle is not needed past this point.
  absl::Status released = driver_->Check(api.MemRelease(handle), "cuMemRelease");
  if (!mapped.ok()) return mapped;
  absl::Status access = driver_->Check(api.MemSetAccess(at, bytes, access_.data(), access_.size()),
                                       "cuMemSetAccess(devices and host, read-write)");
  if (!access.ok() || !released.ok()) {
    (void)api.MemUnmap(at, bytes);
    return !access.ok() ? access : released;
  }
  mapped_.emplace_back(offset, bytes);
  return absl::OkStatus();
}

}  // namespace kvtier::edge::cuda
