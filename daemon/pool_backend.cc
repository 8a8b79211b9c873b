#include "daemon/pool_backend.h"

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "daemon/daemon_core_impl.h"

namespace kvtier::daemon {
namespace {

constexpr const char* kPoolNames[2] = {"DDR", "compressed"};

// Whether one pool can be CUDA VMM: extent size against the granularity, then a probe extent.
absl::Status ProbeVmmPool(const CoreOptions& o, int i, uint64_t granularity) {
  const uint64_t capacity = i == 0 ? o.ddr_pool_bytes : o.compressed_pool_bytes;
  const uint64_t bytes = internal::EffectiveExtentBytes(o.extent_bytes, capacity);
  if (bytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pools.extent_mib: ", kPoolNames[i], " extents of ", bytes,
        " bytes (pools.extent_mib, at most a sixteenth of the budget) are not a multiple of the "
        "CUDA allocation granularity of ",
        granularity, " bytes"));
  }
  const ExtentSource source{ExtentMemory::kCudaVmm, "", o.cuda.get(), o.pinned_numa_node};
  absl::StatusOr<Extent> probe = Extent::Make("kvtier-probe", bytes, source);
  return probe.status();
}

// The driver, checked; the status says why not.
absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>> CheckedDriver(const CoreOptions& o,
                                                                        const DriverLoader& load) {
  if (!o.extent_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("pools.extent_dir = \"", o.extent_dir,
                                                   "\" asks for file extents, not CUDA VMM"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<edge::cuda::Driver> driver, load());
  RETURN_IF_ERROR(driver->CheckHostNumaVmm());
  return std::shared_ptr<const edge::cuda::Driver>(std::move(driver));
}

std::string MemoryLine(const CoreOptions& o, const std::string (&why)[2]) {
  std::string line = absl::StrCat("pools (pools.backend = \"", o.pool_backend, "\"):");
  for (int i = 0; i < 2; ++i) {
    absl::StrAppend(&line, i == 0 ? " " : "; ", kPoolNames[i], " ");
    if (o.pool_memory[i] == ExtentMemory::kCudaVmm) {
      absl::StrAppend(&line, "CUDA VMM pinned on host NUMA node ", o.pinned_numa_node, " (driver ",
                      o.cuda->version(), ")");
    } else {
      absl::StrAppend(&line, "memfd", why[i].empty() ? "" : absl::StrCat(" (", why[i], ")"));
    }
  }
  return line;
}

}  // namespace

absl::StatusOr<std::string> ResolvePoolBackend(CoreOptions* o, const DriverLoader& load) {
  if (!IsPoolBackend(o->pool_backend)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pools.backend = \"", o->pool_backend, "\" ", kPoolBackendChoices));
  }
  o->pool_memory = {ExtentMemory::kMemfd, ExtentMemory::kMemfd};
  o->cuda = nullptr;
  const bool required = o->pool_backend == "cuda_vmm";
  std::string why[2];
  if (o->pool_backend == "memfd") return MemoryLine(*o, why);
  absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>> driver = CheckedDriver(*o, load);
  absl::StatusOr<uint64_t> granularity = absl::UnknownError("");
  if (driver.ok()) {
    o->pinned_numa_node = o->numa_node >= 0 ? o->numa_node : (*driver)->NearestHostNumaNode();
    granularity = (*driver)->HostGranularity(o->pinned_numa_node);
  }
  if (!driver.ok() || !granularity.ok()) {
    const absl::Status& s = !driver.ok() ? driver.status() : granularity.status();
    if (required) {
      return absl::Status(s.code(), absl::StrCat("pools.backend = \"cuda_vmm\": ", s.message()));
    }
    why[0] = why[1] = std::string(s.message());
    return MemoryLine(*o, why);
  }
  o->cuda = *driver;
  for (int i = 0; i < 2; ++i) {
    absl::Status s = ProbeVmmPool(*o, i, *granularity);
    if (s.ok()) {
      o->pool_memory[i] = ExtentMemory::kCudaVmm;
    } else if (required) {
      return absl::Status(s.code(), absl::StrCat("pools.backend = \"cuda_vmm\": ", kPoolNames[i],
                                                 " pool: ", s.message()));
    } else {
      why[i] = std::string(s.message());
    }
  }
  if (o->pool_memory[0] == ExtentMemory::kMemfd && o->pool_memory[1] == ExtentMemory::kMemfd) {
    o->cuda = nullptr;
  }
  return MemoryLine(*o, why);
}

}  // namespace kvtier::daemon
