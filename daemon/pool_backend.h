#ifndef KVTIER_DAEMON_POOL_BACKEND_H_
#define KVTIER_DAEMON_POOL_BACKEND_H_

// pools.backend: what kvtierd's pool memory is made of, decided once at start (docs/cuda.md,
// "Pool backends"). "memfd": memfd (or pools.extent_dir) extents. "cuda_vmm": CUDA VMM pinned
// host-NUMA allocations exported as POSIX descriptors; the daemon refuses to start when it
// cannot make them. "auto": CUDA VMM where the driver loads and can, memfd otherwise, per pool.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/daemon_core.h"
#include "edge/cuda_driver.h"

namespace kvtier::daemon {

// Whether `backend` is one of "auto", "memfd", "cuda_vmm" (header-only: the config parser uses it).
inline bool IsPoolBackend(std::string_view backend) {
  return backend == "auto" || backend == "memfd" || backend == "cuda_vmm";
}
inline constexpr char kPoolBackendChoices[] = "must be \"auto\", \"memfd\" or \"cuda_vmm\"";

using DriverLoader = std::function<absl::StatusOr<std::unique_ptr<edge::cuda::Driver>>()>;

// Resolves o->pool_backend (and o->numa_node) into o->pool_memory, o->cuda and
// o->pinned_numa_node: loads the driver with `load`, checks it, the extents' size against the
// allocation granularity and makes one extent of each CUDA VMM pool. Returns the one log line
// saying which memory each pool is and why. With "cuda_vmm" any failure is the error
// (FAILED_PRECONDITION, or INVALID_ARGUMENT naming pools.extent_mib and the granularity); with
// "auto" it is the reason in the line and that pool is memfd.
absl::StatusOr<std::string> ResolvePoolBackend(CoreOptions* o, const DriverLoader& load);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_POOL_BACKEND_H_
