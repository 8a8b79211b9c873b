#include "edge/cuda_driver.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace kvtier::edge::cuda {
namespace {

constexpr Result kOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY

std::string VersionText(int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10, " (", v, ")"); }

// Binds `name` into `slot`; false with `missing` set when the library lacks it.
template <typename Fn>
bool Bind(void* library, const char* name, Fn* slot, std::string* missing) {
  *slot = reinterpret_cast<Fn>(dlsym(library, name));
  if (*slot == nullptr && missing->empty()) *missing = name;
  return *slot != nullptr;
}

std::string BindAll(void* lib, DriverApi* a) {
  std::string missing;
  Bind(lib, "cuInit", &a->Init, &missing);
  Bind(lib, "cuDriverGetVersion", &a->DriverGetVersion, &missing);
  Bind(lib, "cuDeviceGetCount", &a->DeviceGetCount, &missing);
  Bind(lib, "cuDeviceGet", &a->DeviceGet, &missing);
  Bind(lib, "cuDeviceGetAttribute", &a->DeviceGetAttribute, &missing);
  Bind(lib, "cuMemGetAllocationGranularity", &a->MemGetAllocationGranularity, &missing);
  Bind(lib, "cuMemCreate", &a->MemCreate, &missing);
  Bind(lib, "cuMemRelease", &a->MemRelease, &missing);
  Bind(lib, "cuMemExportToShareableHandle", &a->MemExportToShareableHandle, &missing);
  Bind(lib, "cuMemImportFromShareableHandle", &a->MemImportFromShareableHandle, &missing);
  Bind(lib, "cuMemAddressReserve", &a->MemAddressReserve, &missing);
  Bind(lib, "cuMemAddressFree", &a->MemAddressFree, &missing);
  Bind(lib, "cuMemMap", &a->MemMap, &missing);
  Bind(lib, "cuMemUnmap", &a->MemUnmap, &missing);
  Bind(lib, "cuMemSetAccess", &a->MemSetAccess, &missing);
  Bind(lib, "cuGetErrorString", &a->GetErrorString, &missing);
  return missing;
}

}  // namespace

MemAllocationProp HostNumaProp(int numa_node) {
  MemAllocationProp prop{};
  prop.type = kAllocationPinned;
  prop.requested_handle_types = kHandlePosixFd;
  prop.location = {kLocationHostNuma, numa_node};
  return prop;
}

absl::StatusOr<std::unique_ptr<Driver>> Driver::Load(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver: ", err != nullptr ? err : library.c_str()));
  }
  DriverApi api{};
  if (std::string missing = BindAll(lib, &api); !missing.empty()) {
    dlclose(lib);
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver ", library, " lacks ", missing, ": too old for CUDA VMM"));
  }
  std::unique_ptr<Driver> driver(new Driver(api, lib));
  if (absl::Status s = driver->Initialize(); !s.ok()) return s;
  return driver;
}

absl::StatusOr<std::unique_ptr<Driver>> Driver::FromTable(const DriverApi& api) {
  std::unique_ptr<Driver> driver(new Driver(api, nullptr));
  if (absl::Status s = driver->Initialize(); !s.ok()) return s;
  return driver;
}

Driver::~Driver() {
  if (library_ != nullptr) dlclose(library_);
}

absl::Status Driver::Initialize() {
  if (absl::Status s = Check(api_.Init(0), "cuInit"); !s.ok()) return s;
  return Check(api_.DriverGetVersion(&version_), "cuDriverGetVersion");
}

absl::Status Driver::Check(Result r, absl::string_view what) const {
  if (r == kSuccess) return absl::OkStatus();
  const char* text = nullptr;
  if (api_.GetErrorString == nullptr || api_.GetErrorString(r, &text) != kSuccess ||
      text == nullptr) {
    text = "unknown CUDA error";
  }
  std::string msg = absl::StrCat(what, ": ", text, " (CUresult ", r, ")");
  return r == kOutOfMemory ? absl::ResourceExhaustedError(msg) : absl::FailedPreconditionError(msg);
}

int Driver::DeviceCount() const {
  int count = 0;
  return api_.DeviceGetCount(&count) == kSuccess ? count : 0;
}

absl::Status Driver::CheckHostNumaVmm() const {
  if (version_ < kMinHostNumaVmmDriver) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver ", VersionText(version_), " is older than ",
        VersionText(kMinHostNumaVmmDriver), ", the first with host-NUMA VMM allocations"));
  }
  if (DeviceCount() < 1) return absl::FailedPreconditionError("the CUDA driver sees no device");
  Device dev = 0;
  if (absl::Status s = Check(api_.DeviceGet(&dev, 0), "cuDeviceGet(0)"); !s.ok()) return s;
  int vmm = 0;
  if (absl::Status s = Check(api_.DeviceGetAttribute(&vmm, kAttrVmmSupported, dev),
                             "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
      !s.ok()) {
    return s;
  }
  // Drivers before the host-NUMA attribute existed answer an error: the probe allocation decides.
  int host_numa = 1;
  (void)api_.DeviceGetAttribute(&host_numa, kAttrHostNumaVmmSupported, dev);
  if (vmm == 0 || host_numa == 0) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device 0 does not support ",
                                                      vmm == 0 ? "" : "host-NUMA ",
                                                      "virtual memory management"));
  }
  return absl::OkStatus();
}

int Driver::NearestHostNumaNode() const {
  Device dev = 0;
  int node = -1;
  if (api_.DeviceGet(&dev, 0) != kSuccess ||
      api_.DeviceGetAttribute(&node, kAttrHostNumaId, dev) != kSuccess) {
    return 0;
  }
  return node >= 0 ? node : 0;
}

absl::StatusOr<uint64_t> Driver::HostGranularity(int numa_node) const {
  const MemAllocationProp prop = HostNumaProp(numa_node);
  size_t granularity = 0;
  if (absl::Status s =
          Check(api_.MemGetAllocationGranularity(&granularity, &prop, kGranularityMinimum),
                "cuMemGetAllocationGranularity(host NUMA)");
      !s.ok()) {
    return s;
  }
  if (granularity == 0) return absl::FailedPreconditionError("CUDA granularity of 0 bytes");
  return uint64_t{granularity};
}

}  // namespace kvtier::edge::cuda
