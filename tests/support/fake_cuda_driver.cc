#include "tests/support/fake_cuda_driver.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvtier::testing {
namespace {

using edge::cuda::DevicePtr;
using edge::cuda::MemHandle;
using edge::cuda::Result;

constexpr Result kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE

FakeCudaDriver* g_fake = nullptr;

FakeCudaDriver& Fake() { return *g_fake; }

// The entry points edge/cuda_driver.cc binds: the names failure rules may give.
constexpr const char* kEntryPoints[] = {"cuInit",
                                        "cuDriverGetVersion",
                                        "cuDeviceGetCount",
                                        "cuDeviceGet",
                                        "cuDeviceGetAttribute",
                                        "cuMemGetAllocationGranularity",
                                        "cuMemCreate",
                                        "cuMemRelease",
                                        "cuMemExportToShareableHandle",
                                        "cuMemImportFromShareableHandle",
                                        "cuMemAddressReserve",
                                        "cuMemAddressFree",
                                        "cuMemMap",
                                        "cuMemUnmap",
                                        "cuMemSetAccess",
                                        "cuGetErrorString"};

bool IsEntryPoint(absl::string_view name) {
  return std::find(std::begin(kEntryPoints), std::end(kEntryPoints), name) !=
         std::end(kEntryPoints);
}

absl::Status BadItem(absl::string_view item, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(FakeCudaDriver::kEnv, ": item \"", item, "\" ", why));
}

void* AsPointer(DevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

}  // namespace

FakeCudaDriver::FakeCudaDriver() { g_fake = this; }

FakeCudaDriver::~FakeCudaDriver() {
  for (auto& [h, handle] : handles_) close(handle.fd);
  for (auto& [p, bytes] : reservations_) munmap(AsPointer(p), bytes);
  g_fake = nullptr;
}

std::shared_ptr<const edge::cuda::Driver> FakeCudaDriver::Load() {
  absl::StatusOr<std::unique_ptr<edge::cuda::Driver>> d = edge::cuda::Driver::FromTable(Table());
  if (!d.ok()) return nullptr;
  return std::shared_ptr<const edge::cuda::Driver>(*std::move(d));
}

void FakeCudaDriver::FailNext(const std::string& name, Result result) {
  rules_.push_back({.name = name, .times = 1, .result = result});
}

absl::Status FakeCudaDriver::Configure(absl::string_view spec) {
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    if (absl::Status s = ConfigureItem(absl::StripAsciiWhitespace(item)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FakeCudaDriver::ConfigureItem(absl::string_view item) {
  if (const size_t eq = item.find('='); eq != absl::string_view::npos && item.find(':') > eq) {
    const absl::string_view key = item.substr(0, eq);
    int64_t v = 0;
    if (!absl::SimpleAtoi(item.substr(eq + 1), &v) || v < 0) {
      return BadItem(item, "needs a non-negative integer after '='");
    }
    if (key == "version") {
      version = static_cast<int>(v);
    } else if (key == "devices") {
      devices = static_cast<int>(v);
    } else if (key == "granularity" && v > 0) {
      granularity = static_cast<uint64_t>(v);
    } else if (key == "host_numa_id") {
      host_numa_id = static_cast<int>(v);
    } else if (key == "host_numa_vmm") {
      host_numa_vmm_supported = v != 0;
    } else {
      return BadItem(item,
                     "is not one of version=, devices=, granularity= (positive), "
                     "host_numa_id=, host_numa_vmm=");
    }
    return absl::OkStatus();
  }
  std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
  if (!IsEntryPoint(parts[0])) {
    return BadItem(item, "names no entry point of edge/cuda_driver (cuInit, cuMemCreate, ...)");
  }
  FailRule rule{.name = std::string(parts[0])};
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view p = parts[i];
    if (p == "oom") {
      rule.result = 2;  // CUDA_ERROR_OUT_OF_MEMORY
      continue;
    }
    uint64_t* field = absl::ConsumePrefix(&p, "after=")   ? &rule.after
                      : absl::ConsumePrefix(&p, "above=") ? &rule.above
                                                          : nullptr;
    if (field == nullptr || !absl::SimpleAtoi(p, field)) {
      return BadItem(item,
                     absl::StrCat("has \"", parts[i], "\": expected after=N, above=BYTES or oom"));
    }
    rule.sized = rule.sized || field == &rule.above;
  }
  rules_.push_back(std::move(rule));
  return absl::OkStatus();
}

Result FakeCudaDriver::Enter(const char* name, uint64_t bytes) {
  calls.emplace_back(name);
  for (FailRule& rule : rules_) {
    if (rule.times == 0 || rule.name != name || (rule.sized && bytes <= rule.above)) continue;
    if (++rule.seen <= rule.after) continue;
    if (rule.times > 0) --rule.times;
    return rule.result;
  }
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Create(MemHandle* h, size_t size,
                              const edge::cuda::MemAllocationProp* prop) {
  if (prop->type != edge::cuda::kAllocationPinned ||
      prop->location.type != edge::cuda::kLocationHostNuma ||
      prop->requested_handle_types != edge::cuda::kHandlePosixFd || size == 0 ||
      size % granularity != 0) {
    return kInvalidValue;
  }
  const int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  }
  *h = next_handle_++;
  handles_[*h] = {fd, size};
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Release(MemHandle h) {
  auto it = handles_.find(h);
  if (it == handles_.end()) return kInvalidValue;
  close(it->second.fd);
  handles_.erase(it);
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Export(void* shareable, MemHandle h, int type) {
  auto it = handles_.find(h);
  if (it == handles_.end() || type != edge::cuda::kHandlePosixFd) return kInvalidValue;
  *static_cast<int*>(shareable) = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Import(MemHandle* h, void* os_handle, int type) {
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat st;
  if (type != edge::cuda::kHandlePosixFd || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return kInvalidValue;
  }
  *h = next_handle_++;
  handles_[*h] = {fcntl(fd, F_DUPFD_CLOEXEC, 0), static_cast<uint64_t>(st.st_size)};
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Reserve(DevicePtr* ptr, size_t size, size_t alignment) {
  // As the driver: the alignment is a power of two (0: the granularity), the size a multiple of it.
  if (alignment == 0) alignment = granularity;
  if (size == 0 || (alignment & (alignment - 1)) != 0 || size % alignment != 0) {
    return kInvalidValue;
  }
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 2;
  *ptr = reinterpret_cast<uintptr_t>(p);
  reservations_[*ptr] = size;
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Free(DevicePtr ptr, size_t size) {
  auto it = reservations_.find(ptr);
  if (it == reservations_.end() || it->second != size) return kInvalidValue;
  for (const auto& [p, bytes] : mappings_) {
    if (p >= ptr && p < ptr + size) return kInvalidValue;  // the driver wants it unmapped first
  }
  munmap(AsPointer(ptr), size);
  reservations_.erase(it);
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Map(DevicePtr ptr, size_t size, MemHandle h) {
  auto it = handles_.find(h);
  if (it == handles_.end() || it->second.bytes < size || mappings_.count(ptr) != 0) {
    return kInvalidValue;
  }
  void* got = mmap(AsPointer(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, it->second.fd, 0);
  if (got == MAP_FAILED) return kInvalidValue;
  mappings_[ptr] = size;
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::Unmap(DevicePtr ptr, size_t size) {
  auto it = mappings_.find(ptr);
  if (it == mappings_.end() || it->second != size) return kInvalidValue;
  mmap(AsPointer(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
       0);
  mappings_.erase(it);
  return edge::cuda::kSuccess;
}

Result FakeCudaDriver::SetAccess(DevicePtr ptr, size_t size, const edge::cuda::MemAccessDesc* desc,
                                 size_t count) {
  auto it = mappings_.find(ptr);
  if (it == mappings_.end() || it->second != size) return kInvalidValue;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type == edge::cuda::kLocationHostNuma &&
        desc[i].flags == edge::cuda::kAccessReadWrite) {
      mprotect(AsPointer(ptr), size, PROT_READ | PROT_WRITE);
    }
  }
  return edge::cuda::kSuccess;
}

edge::cuda::DriverApi FakeCudaDriver::Table() {
  edge::cuda::DriverApi a{};
  a.Init = [](unsigned) { return Fake().Enter("cuInit"); };
  a.DriverGetVersion = [](int* v) {
    *v = Fake().version;
    return Fake().Enter("cuDriverGetVersion");
  };
  a.DeviceGetCount = [](int* n) {
    *n = Fake().devices;
    return Fake().Enter("cuDeviceGetCount");
  };
  a.DeviceGet = [](edge::cuda::Device* d, int ordinal) {
    *d = ordinal;
    return Fake().Enter("cuDeviceGet");
  };
  a.DeviceGetAttribute = [](int* v, int attr, edge::cuda::Device) {
    *v = attr == edge::cuda::kAttrHostNumaVmmSupported ? Fake().host_numa_vmm_supported
         : attr == edge::cuda::kAttrHostNumaId         ? Fake().host_numa_id
                                                       : 1;
    return Fake().Enter("cuDeviceGetAttribute");
  };
  a.MemGetAllocationGranularity = [](size_t* g, const edge::cuda::MemAllocationProp*, int) {
    *g = Fake().granularity;
    return Fake().Enter("cuMemGetAllocationGranularity");
  };
  a.MemCreate = [](MemHandle* h, size_t size, const edge::cuda::MemAllocationProp* prop,
                   unsigned long long) {
    Result r = Fake().Enter("cuMemCreate", size);
    return r != edge::cuda::kSuccess ? r : Fake().Create(h, size, prop);
  };
  a.MemRelease = [](MemHandle h) {
    Result r = Fake().Enter("cuMemRelease");
    Result done = Fake().Release(h);  // a failing release still releases (as the test expects)
    return r != edge::cuda::kSuccess ? r : done;
  };
  a.MemExportToShareableHandle = [](void* out, MemHandle h, int type, unsigned long long) {
    Result r = Fake().Enter("cuMemExportToShareableHandle");
    return r != edge::cuda::kSuccess ? r : Fake().Export(out, h, type);
  };
  a.MemImportFromShareableHandle = [](MemHandle* h, void* os, int type) {
    Result r = Fake().Enter("cuMemImportFromShareableHandle");
    return r != edge::cuda::kSuccess ? r : Fake().Import(h, os, type);
  };
  a.MemAddressReserve = [](DevicePtr* p, size_t size, size_t alignment, DevicePtr,
                           unsigned long long) {
    Result r = Fake().Enter("cuMemAddressReserve", size);
    return r != edge::cuda::kSuccess ? r : Fake().Reserve(p, size, alignment);
  };
  a.MemAddressFree = [](DevicePtr p, size_t size) {
    Result r = Fake().Enter("cuMemAddressFree");
    return r != edge::cuda::kSuccess ? r : Fake().Free(p, size);
  };
  a.MemMap = [](DevicePtr p, size_t size, size_t, MemHandle h, unsigned long long) {
    Result r = Fake().Enter("cuMemMap", size);
    return r != edge::cuda::kSuccess ? r : Fake().Map(p, size, h);
  };
  a.MemUnmap = [](DevicePtr p, size_t size) {
    Result r = Fake().Enter("cuMemUnmap");
    return r != edge::cuda::kSuccess ? r : Fake().Unmap(p, size);
  };
  a.MemSetAccess = [](DevicePtr p, size_t size, const edge::cuda::MemAccessDesc* d, size_t n) {
    Result r = Fake().Enter("cuMemSetAccess");
    return r != edge::cuda::kSuccess ? r : Fake().SetAccess(p, size, d, n);
  };
  a.GetErrorString = [](Result r, const char** text) {
    *text = r == 2 ? "out of memory" : r == kInjected ? "injected failure" : "fake CUDA error";
    return edge::cuda::kSuccess;
  };
  return a;
}

std::vector<int> LiveInLoadedFakeLibrary(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return {};
  auto live = reinterpret_cast<void (*)(int*)>(dlsym(lib, "kvtier_fake_cuda_live"));
  std::vector<int> counts(3, -1);
  if (live != nullptr) live(counts.data());
  dlclose(lib);
  return counts;
}

}  // namespace kvtier::testing
