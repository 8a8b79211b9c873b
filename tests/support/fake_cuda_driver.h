#ifndef KVTIER_TESTS_SUPPORT_FAKE_CUDA_DRIVER_H_
#define KVTIER_TESTS_SUPPORT_FAKE_CUDA_DRIVER_H_

// A fake CUDA driver behind edge/cuda_driver.h's table: the one mock the project allows, since
// no driver exists on the machines that run the unit tests. It keeps the real path honest:
// allocations are memfd segments, an exported handle is a real descriptor (it can cross a unix
// socket with SCM_RIGHTS), importing finds the allocation by the descriptor's inode, a reserved
// range is real address space that cuMemMap fills and cuMemSetAccess opens for the host. Every
// call is recorded, any call can be made to fail, and the live handles, mappings and ranges are
// counted, so tests can show that a failure leaks nothing.
//
// The same fake is also a real shared library, libkvtier_fake_cuda.so (fake_cuda_library.cc),
// which exports the driver's C entry points over one instance configured from the environment
// variable KVTIER_FAKE_CUDA (Configure's syntax), so that separate processes (kvtierd, a worker)
// can load it by name and be told to fail at a given step.
//
// Not thread-safe; at most one instance at a time (the table's plain functions reach it through
// a static pointer). The shared library serializes every call on one mutex.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "edge/cuda_driver.h"

namespace kvtier::testing {

class FakeCudaDriver {
 public:
  FakeCudaDriver();
  ~FakeCudaDriver();
  FakeCudaDriver(const FakeCudaDriver&) = delete;
  FakeCudaDriver& operator=(const FakeCudaDriver&) = delete;

  // The table (for edge::cuda::Driver::FromTable) and a driver over it.
  static edge::cuda::DriverApi Table();
  std::shared_ptr<const edge::cuda::Driver> Load();

  // The environment variable the shared library reads its configuration from.
  static constexpr char kEnv[] = "KVTIER_FAKE_CUDA";
  // What failed calls return unless told otherwise ("injected failure").
  static constexpr edge::cuda::Result kInjected = 999;

  // The next call to the entry point named `name` ("cuMemCreate", ...) returns `result`.
  void FailNext(const std::string& name, edge::cuda::Result result = kInjected);

  // Applies `spec`, a comma-separated list of items:
  //   version=N  devices=N  granularity=BYTES  host_numa_id=N  host_numa_vmm=0|1
  //     what the fake reports (cuDriverGetVersion 12010 is CUDA 12.1);
  //   cuName[:after=N][:above=BYTES][:oom]
  //     every call to the entry point cuName fails (CUresult 999, or 2 = out of memory with
  //     :oom) once N calls to it have succeeded (default 0); with :above only calls for more
  //     than BYTES (cuMemCreate, cuMemMap, cuMemAddressReserve sizes) count and fail.
  // E.g. "cuMemImportFromShareableHandle:after=1" (the second import fails, and every later
  // one), "version=12010", "cuMemCreate:oom:above=2097152". INVALID_ARGUMENT naming the item
  // and what is wrong with it; items before a bad one stay applied.
  absl::Status Configure(absl::string_view spec);

  // What the fake reports.
  int version = 13000;
  int devices = 1;
  uint64_t granularity = 2 << 20;
  int host_numa_vmm_supported = 1;
  int host_numa_id = 0;

  // Entry points called so far, in order ("cuMemCreate", ...).
  std::vector<std::string> calls;
  // Live objects: handles (created or imported, not released), mapped ranges, reservations.
  int live_handles() const { return static_cast<int>(handles_.size()); }
  int live_mappings() const { return static_cast<int>(mappings_.size()); }
  int live_reservations() const { return static_cast<int>(reservations_.size()); }

  // Implementation of the table's entry points (public for the trampolines in the .cc).
  // Records the call; the result a failure rule gives it (kSuccess: go on). `bytes`: the size
  // the call is for, 0 when it has none.
  edge::cuda::Result Enter(const char* name, uint64_t bytes = 0);
  edge::cuda::Result Create(edge::cuda::MemHandle* h, size_t size,
                            const edge::cuda::MemAllocationProp* prop);
  edge::cuda::Result Release(edge::cuda::MemHandle h);
  edge::cuda::Result Export(void* shareable, edge::cuda::MemHandle h, int type);
  edge::cuda::Result Import(edge::cuda::MemHandle* h, void* os_handle, int type);
  edge::cuda::Result Reserve(edge::cuda::DevicePtr* ptr, size_t size, size_t alignment);
  edge::cuda::Result Free(edge::cuda::DevicePtr ptr, size_t size);
  edge::cuda::Result Map(edge::cuda::DevicePtr ptr, size_t size, edge::cuda::MemHandle h);
  edge::cuda::Result Unmap(edge::cuda::DevicePtr ptr, size_t size);
  edge::cuda::Result SetAccess(edge::cuda::DevicePtr ptr, size_t size,
                               const edge::cuda::MemAccessDesc* desc, size_t count);

 private:
  struct Handle {
    int fd;  // this handle's own descriptor of the allocation's memfd
    uint64_t bytes;
  };
  struct FailRule {
    std::string name;
    uint64_t after = 0;  // calls that succeed before the rule bites
    bool sized = false;  // only calls for more than `above` bytes count
    uint64_t above = 0;
    int64_t times = -1;  // failures left; -1 = every call from then on
    edge::cuda::Result result = kInjected;
    uint64_t seen = 0;  // matching calls so far
  };
  absl::Status ConfigureItem(absl::string_view item);

  std::vector<FailRule> rules_;
  std::map<edge::cuda::MemHandle, Handle> handles_;
  std::map<edge::cuda::DevicePtr, uint64_t> mappings_;      // address -> bytes
  std::map<edge::cuda::DevicePtr, uint64_t> reservations_;  // address -> bytes
  edge::cuda::MemHandle next_handle_ = 1;
};

// The live handles, mappings and reservations of libkvtier_fake_cuda.so at `library` in this
// process ({} when this process has not loaded it).
std::vector<int> LiveInLoadedFakeLibrary(const std::string& library);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_FAKE_CUDA_DRIVER_H_
