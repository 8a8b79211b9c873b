#ifndef KVTIER_WORKER_CUDA_SIM_DEVICE_MEMORY_H_
#define KVTIER_WORKER_CUDA_SIM_DEVICE_MEMORY_H_

// The simulated device's memory: guarded host mappings for cudaMalloc and cudaMallocHost, and the
// table of every range the device may touch (those, plus cudaHostRegister'ed host ranges).
// Thread-safe.

#include <cstddef>
#include <cstdint>

namespace kvtier::cudasim {

enum class MemoryKind : uint8_t {
  kPageable = 0,    // host memory the runtime knows nothing of
  kDevice = 1,      // cudaMalloc
  kPinnedHost = 2,  // cudaMallocHost
  kRegistered = 3,  // cudaHostRegister
};

// What the address p lies in: its kind and, unless kPageable, the range's base and size.
struct Range {
  MemoryKind kind = MemoryKind::kPageable;
  uintptr_t base = 0;
  uint64_t bytes = 0;
  bool Contains(const void* p, uint64_t n) const;
};
Range Lookup(const void* p);

// Whether [p, p + n) lies inside one range the device can reach (device memory, pinned or
// registered host memory). n = 0 is accessible anywhere.
bool DeviceAccessible(const void* p, uint64_t n);

// A guarded allocation of `bytes` (> 0), 256-byte aligned, poisoned; null when the simulated
// device's memory (KVTIER_CUDA_SIM_HBM_BYTES, default 16 GiB of address space) is exhausted.
void* AllocateGuarded(uint64_t bytes, MemoryKind kind);
// Frees a pointer AllocateGuarded returned for `kind`; false when p is not one (nothing done).
// Aborts naming the allocation when its red zone was overwritten.
bool FreeGuarded(void* p, MemoryKind kind);

// cudaHostRegister's checks and bookkeeping: cudaErrorInvalidValue unless every page of the
// range is mapped readable and writable (the driver pins every page), AlreadyRegistered when it
// overlaps a registered or pinned range. Returns the cudaError_t value.
int RegisterHost(void* p, uint64_t bytes);
// cudaErrorHostMemoryNotRegistered unless p is the base of a registered range.
int UnregisterHost(void* p);

}  // namespace kvtier::cudasim

#endif  // KVTIER_WORKER_CUDA_SIM_DEVICE_MEMORY_H_
