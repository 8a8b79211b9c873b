// libkvtier_fake_cuda.so: the fake CUDA driver (fake_cuda_driver.h) as a library that
// edge::cuda::Driver::Load can dlopen by name, so that real processes — kvtierd with
// pools.cuda_library, a worker with ClientOptions::cuda_library — run the CUDA VMM path over real
// memfds and mappings. One instance per process, made at the first call and configured from
// KVTIER_FAKE_CUDA (FakeCudaDriver::Configure); a bad value makes cuInit fail with an error
// string that names the item. Every entry point takes one mutex: the daemon calls the driver
// from several threads.
//
// One entry point of its own, for a process that loads it too (dlopen of the same path shares
// the instance): void kvtier_fake_cuda_live(int counts[3]) gives the live handles, mappings and
// reservations, so a worker can show that a failure left nothing behind.

#include <cstdlib>
#include <mutex>
#include <string>

#include "tests/support/fake_cuda_driver.h"

namespace {

using kvtier::edge::cuda::Device;
using kvtier::edge::cuda::DevicePtr;
using kvtier::edge::cuda::DriverApi;
using kvtier::edge::cuda::MemAccessDesc;
using kvtier::edge::cuda::MemAllocationProp;
using kvtier::edge::cuda::MemHandle;
using kvtier::edge::cuda::Result;
using kvtier::testing::FakeCudaDriver;

constexpr Result kBadConfiguration = 998;  // what cuInit answers when KVTIER_FAKE_CUDA is bad

std::mutex g_mu;
FakeCudaDriver* g_instance =
    nullptr;                 // guarded by g_mu; never freed (lives as long as the process)
std::string g_config_error;  // guarded by g_mu

// The table over the instance, made and configured on first use. REQUIRES: g_mu held.
const DriverApi& ApiLocked() {
  if (g_instance == nullptr) {
    g_instance = new FakeCudaDriver();
    const char* spec = std::getenv(FakeCudaDriver::kEnv);
    const absl::Status s = g_instance->Configure(spec != nullptr ? spec : "");
    if (!s.ok()) g_config_error = std::string(s.message());
  }
  static const DriverApi api = FakeCudaDriver::Table();
  return api;
}

// Calls the table's entry point `Member` under the lock.
template <auto Member, typename... Args>
Result Call(Args... args) {
  std::lock_guard<std::mutex> lock(g_mu);
  return (ApiLocked().*Member)(args...);
}

}  // namespace

#define KVTIER_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

KVTIER_FAKE_EXPORT Result cuInit(unsigned flags) {
  std::lock_guard<std::mutex> lock(g_mu);
  const DriverApi& api = ApiLocked();
  return g_config_error.empty() ? api.Init(flags) : kBadConfiguration;
}
KVTIER_FAKE_EXPORT Result cuDriverGetVersion(int* version) {
  return Call<&DriverApi::DriverGetVersion>(version);
}
KVTIER_FAKE_EXPORT Result cuDeviceGetCount(int* count) {
  return Call<&DriverApi::DeviceGetCount>(count);
}
KVTIER_FAKE_EXPORT Result cuDeviceGet(Device* device, int ordinal) {
  return Call<&DriverApi::DeviceGet>(device, ordinal);
}
KVTIER_FAKE_EXPORT Result cuDeviceGetAttribute(int* value, int attribute, Device device) {
  return Call<&DriverApi::DeviceGetAttribute>(value, attribute, device);
}
KVTIER_FAKE_EXPORT Result cuMemGetAllocationGranularity(size_t* granularity,
                                                        const MemAllocationProp* prop, int option) {
  return Call<&DriverApi::MemGetAllocationGranularity>(granularity, prop, option);
}
KVTIER_FAKE_EXPORT Result cuMemCreate(MemHandle* handle, size_t size, const MemAllocationProp* prop,
                                      unsigned long long flags) {
  return Call<&DriverApi::MemCreate>(handle, size, prop, flags);
}
KVTIER_FAKE_EXPORT Result cuMemRelease(MemHandle handle) {
  return Call<&DriverApi::MemRelease>(handle);
}
KVTIER_FAKE_EXPORT Result cuMemExportToShareableHandle(void* shareable, MemHandle handle,
                                                       int handle_type, unsigned long long flags) {
  return Call<&DriverApi::MemExportToShareableHandle>(shareable, handle, handle_type, flags);
}
KVTIER_FAKE_EXPORT Result cuMemImportFromShareableHandle(MemHandle* handle, void* os_handle,
                                                         int handle_type) {
  return Call<&DriverApi::MemImportFromShareableHandle>(handle, os_handle, handle_type);
}
KVTIER_FAKE_EXPORT Result cuMemAddressReserve(DevicePtr* ptr, size_t size, size_t alignment,
                                              DevicePtr addr, unsigned long long flags) {
  return Call<&DriverApi::MemAddressReserve>(ptr, size, alignment, addr, flags);
}
KVTIER_FAKE_EXPORT Result cuMemAddressFree(DevicePtr ptr, size_t size) {
  return Call<&DriverApi::MemAddressFree>(ptr, size);
}
KVTIER_FAKE_EXPORT Result cuMemMap(DevicePtr ptr, size_t size, size_t offset, MemHandle handle,
                                   unsigned long long flags) {
  return Call<&DriverApi::MemMap>(ptr, size, offset, handle, flags);
}
KVTIER_FAKE_EXPORT Result cuMemUnmap(DevicePtr ptr, size_t size) {
  return Call<&DriverApi::MemUnmap>(ptr, size);
}
KVTIER_FAKE_EXPORT Result cuMemSetAccess(DevicePtr ptr, size_t size, const MemAccessDesc* desc,
                                         size_t count) {
  return Call<&DriverApi::MemSetAccess>(ptr, size, desc, count);
}
KVTIER_FAKE_EXPORT Result cuGetErrorString(Result error, const char** text) {
  std::lock_guard<std::mutex> lock(g_mu);
  const DriverApi& api = ApiLocked();
  if (error != kBadConfiguration) return api.GetErrorString(error, text);
  *text = g_config_error.empty() ? "bad KVTIER_FAKE_CUDA" : g_config_error.c_str();
  return kvtier::edge::cuda::kSuccess;
}

KVTIER_FAKE_EXPORT void kvtier_fake_cuda_live(int counts[3]) {
  std::lock_guard<std::mutex> lock(g_mu);
  (void)ApiLocked();
  counts[0] = g_instance->live_handles();
  counts[1] = g_instance->live_mappings();
  counts[2] = g_instance->live_reservations();
}
