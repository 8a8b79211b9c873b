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
// Not thread-safe; at most one instance at a time (the table's plain functions reach it through
// a static pointer).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

  // The next call to the entry point named `name` ("cuMemCreate", ...) returns `result`.
  void FailNext(const std::string& name, edge::cuda::Result result = 999);

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
  edge::cuda::Result Enter(const char* name);
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
  std::map<std::string, edge::cuda::Result> fail_next_;
  std::map<edge::cuda::MemHandle, Handle> handles_;
  std::map<edge::cuda::DevicePtr, uint64_t> mappings_;      // address -> bytes
  std::map<edge::cuda::DevicePtr, uint64_t> reservations_;  // address -> bytes
  edge::cuda::MemHandle next_handle_ = 1;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_FAKE_CUDA_DRIVER_H_
