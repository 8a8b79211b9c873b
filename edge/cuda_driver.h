#ifndef KVTIER_EDGE_CUDA_DRIVER_H_
#define KVTIER_EDGE_CUDA_DRIVER_H_

// The CUDA driver API as kvtierd and the client library use it: loaded at run time
// (dlopen("libcuda.so.1")), so both build and run on hosts without CUDA. Only the entry points of
// the virtual memory management (VMM) path are bound, with the project's own declarations of the
// few types they take (the documented driver ABI; cuda.h is not included). The table of function
// pointers is public so that tests can drive every path with a fake driver.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::edge::cuda {

// Driver ABI types (cuda.h names in comments).
using Result = int;          // CUresult; 0 = CUDA_SUCCESS
using Device = int;          // CUdevice
using DevicePtr = uint64_t;  // CUdeviceptr
using MemHandle = uint64_t;  // CUmemGenericAllocationHandle
inline constexpr Result kSuccess = 0;

inline constexpr int kLocationDevice = 1;              // CU_MEM_LOCATION_TYPE_DEVICE
inline constexpr int kLocationHostNuma = 3;            // CU_MEM_LOCATION_TYPE_HOST_NUMA
inline constexpr int kAllocationPinned = 1;            // CU_MEM_ALLOCATION_TYPE_PINNED
inline constexpr int kHandlePosixFd = 1;               // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
inline constexpr int kAccessReadWrite = 3;             // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
inline constexpr int kGranularityMinimum = 0;          // CU_MEM_ALLOC_GRANULARITY_MINIMUM
inline constexpr int kAttrVmmSupported = 102;          // ..._VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
inline constexpr int kAttrHostNumaId = 134;            // CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID
inline constexpr int kAttrHostNumaVmmSupported = 141;  // ..._HOST_NUMA_VIRTUAL_MEMORY_..._SUPPORTED
// Host-NUMA locations for cuMemCreate came with CUDA 12.2 (cuDriverGetVersion 12020).
inline constexpr int kMinHostNumaVmmDriver = 12020;

struct MemLocation {  // CUmemLocation
  int type;
  int id;
};
struct MemAllocationProp {  // CUmemAllocationProp
  int type;
  int requested_handle_types;
  MemLocation location;
  void* win32_handle_metadata;
  struct {
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
  } alloc_flags;
};
struct MemAccessDesc {  // CUmemAccessDesc
  MemLocation location;
  int flags;
};
static_assert(sizeof(MemLocation) == 8);
static_assert(sizeof(MemAllocationProp) == 32);
static_assert(sizeof(MemAccessDesc) == 12);

// The bound entry points, named after the driver's without the "cu" prefix.
struct DriverApi {
  Result (*Init)(unsigned flags);
  Result (*DriverGetVersion)(int* version);
  Result (*DeviceGetCount)(int* count);
  Result (*DeviceGet)(Device* device, int ordinal);
  Result (*DeviceGetAttribute)(int* value, int attribute, Device device);
  Result (*MemGetAllocationGranularity)(size_t* granularity, const MemAllocationProp* prop,
                                        int option);
  Result (*MemCreate)(MemHandle* handle, size_t size, const MemAllocationProp* prop,
                      unsigned long long flags);
  Result (*MemRelease)(MemHandle handle);
  Result (*MemExportToShareableHandle)(void* shareable, MemHandle handle, int handle_type,
                                       unsigned long long flags);
  Result (*MemImportFromShareableHandle)(MemHandle* handle, void* os_handle, int handle_type);
  Result (*MemAddressReserve)(DevicePtr* ptr, size_t size, size_t alignment, DevicePtr addr,
                              unsigned long long flags);
  Result (*MemAddressFree)(DevicePtr ptr, size_t size);
  Result (*MemMap)(DevicePtr ptr, size_t size, size_t offset, MemHandle handle,
                   unsigned long long flags);
  Result (*MemUnmap)(DevicePtr ptr, size_t size);
  Result (*MemSetAccess)(DevicePtr ptr, size_t size, const MemAccessDesc* desc, size_t count);
  Result (*GetErrorString)(Result error, const char** text);
};

// A loaded, initialized driver. Thread-safe (the driver's entry points are); immutable.
class Driver {
 public:
  // dlopen(`library`) + dlsym of every entry point + cuInit(0). FAILED_PRECONDITION
  // "no CUDA driver: libcuda.so.1: <dlerror>" when the library is missing, naming the symbol when
  // one is, and the driver's error when cuInit fails.
  static absl::StatusOr<std::unique_ptr<Driver>> Load(const std::string& library = "libcuda.so.1");
  // Over a given table (tests: a fake driver): cuInit(0) and the version, as Load.
  static absl::StatusOr<std::unique_ptr<Driver>> FromTable(const DriverApi& api);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const DriverApi& api() const { return api_; }
  int version() const { return version_; }  // cuDriverGetVersion: 1000 * major + 10 * minor

  // OK for kSuccess; otherwise "<what>: <CUDA error string> (CUresult <code>)". Out of memory
  // (2) is RESOURCE_EXHAUSTED, everything else FAILED_PRECONDITION (a driver or device that
  // cannot do what was asked).
  absl::Status Check(Result r, absl::string_view what) const;

  // Whether pinned host-NUMA VMM allocations that export POSIX descriptors can work here: a
  // recent enough driver (FAILED_PRECONDITION naming both versions), a device, VMM support.
  absl::Status CheckHostNumaVmm() const;
  // The number of visible devices (0 when the driver sees none).
  int DeviceCount() const;
  // The host NUMA node nearest device 0, or 0 when the driver cannot tell.
  int NearestHostNumaNode() const;
  // The minimum granularity of a pinned host-NUMA allocation on `numa_node`.
  absl::StatusOr<uint64_t> HostGranularity(int numa_node) const;

 private:
  Driver(const DriverApi& api, void* library) : api_(api), library_(library) {}
  absl::Status Initialize();

  const DriverApi api_;
  void* const library_;  // dlopen handle, null for a given table
  int version_ = 0;
};

// The properties of a pinned host allocation on `numa_node` exportable as a POSIX descriptor.
MemAllocationProp HostNumaProp(int numa_node);

}  // namespace kvtier::edge::cuda

#endif  // KVTIER_EDGE_CUDA_DRIVER_H_
