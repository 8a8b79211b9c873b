// The simulated CUDA runtime's entry points (cuda_runtime_sim.h): errors, device, memory, streams,
// events and copies.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "worker/cuda/sim/copy_trace.h"
#include "worker/cuda/sim/counters.h"
#include "worker/cuda/sim/cuda_runtime_sim.h"
#include "worker/cuda/sim/device_memory.h"
#include "worker/cuda/sim/streams.h"

namespace kvtier::cudasim {
namespace {

int Devices() {
  static const int n = [] {
    const char* env = std::getenv("KVTIER_CUDA_SIM_DEVICES");
    return env != nullptr ? std::atoi(env) : 1;
  }();
  return n;
}

// One runtime call of the host's (Count*), one that blocks it on the device, one copy call.
void Called() { Count(Counter::kRuntimeCall); }
void Waited() { Count(Counter::kHostWait); }
void CopyCalled(uint64_t descriptors) {
  Count(Counter::kCopyCall);
  Count(Counter::kCopyDescriptor, descriptors);
}

// Synchronizing calls return the device's fault once it has one.
cudaError_t Synced() { return Fail(Sticky()); }

// One side of a copy: where it points, and whether the runtime accepts it for `kind`.
struct Side {
  Range range;
  bool ok = true;
};
Side Classify(const void* p, size_t bytes, bool device_side_required) {
  Side s{Lookup(p)};
  const bool device = s.range.kind == MemoryKind::kDevice;
  if (device && !s.range.Contains(p, bytes)) s.ok = false;  // runs off its allocation
  if (device_side_required && !device) s.ok = false;
  return s;
}
bool Pinned(const Side& s) { return s.range.kind != MemoryKind::kPageable; }

// Validates a copy as cudaMemcpy* does.
bool CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Side* d, Side* s) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return false;
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return false;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  *d = Classify(dst, bytes, dst_dev);
  *s = Classify(src, bytes, src_dev);
  if (kind == cudaMemcpyHostToDevice && s->range.kind == MemoryKind::kDevice) return false;
  if (kind == cudaMemcpyDeviceToHost && d->range.kind == MemoryKind::kDevice) return false;
  return d->ok && s->ok;
}

// A pinned range must still be pinned when the DMA runs (unregistering under a copy in flight).
bool StillPinned(const Side& side, const void* p, size_t bytes) {
  if (!Pinned(side)) return true;
  if (DeviceAccessible(p, bytes)) return true;
  Fault(nullptr, "pinned range unregistered or freed before its copy ran", p, bytes);
  return false;
}

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
  Side d, s;
};

// Enqueues copies on `stream` with the runtime's pageable-memory rules: a pageable source is
// read at the call (staged), a pageable destination makes the call wait for the copy.
cudaError_t Issue(std::vector<Copy> copies, cudaStream_t stream) {
  std::shared_ptr<CUstream_st> st = Resolve(stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  bool wait = false;
  auto staged = std::make_shared<std::vector<std::vector<uint8_t>>>(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    Copy& c = copies[i];
    TraceCopy(c.src, c.dst, c.bytes);
    if (!Pinned(c.s)) {
      const uint8_t* src = static_cast<const uint8_t*>(c.src);
      (*staged)[i].assign(src, src + c.bytes);
      c.src = (*staged)[i].data();
    }
    if (!Pinned(c.d)) wait = true;
    if (c.d.range.kind == MemoryKind::kDevice && c.s.range.kind != MemoryKind::kDevice) {
      Count(Counter::kH2dBytes, c.bytes);
    }
  }
  Submit(*st, Op{[copies, staged] {
                   for (const Copy& c : copies) {
                     if (!StillPinned(c.s, c.src, c.bytes) || !StillPinned(c.d, c.dst, c.bytes)) {
                       return;
                     }
                     std::memmove(c.dst, c.src, c.bytes);
                   }
                 },
                 nullptr, false});
  if (wait) {
    Waited();
    st->Synchronize();
    return Synced();
  }
  return cudaSuccess;
}

}  // namespace

// The entry points' work, uncounted: what other entry points call.
cudaError_t MallocHost(void** ptr, size_t bytes);
cudaError_t StreamSynchronize(cudaStream_t stream);
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream);
cudaError_t MemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);

}  // namespace kvtier::cudasim

namespace cs = kvtier::cudasim;

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetLastError() { return cs::TakeLastError(); }
cudaError_t cudaPeekAtLastError() { return cs::PeekLastError(); }

cudaError_t cudaGetDeviceCount(int* count) {
  cs::Called();
  if (count == nullptr) return cs::Fail(cudaErrorInvalidValue);
  *count = cs::Devices();
  return cs::Devices() > 0 ? cudaSuccess : cs::Fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  cs::Called();
  return device >= 0 && device < cs::Devices() ? cudaSuccess : cs::Fail(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceSynchronize() {
  cs::Called();
  cs::Waited();
  cs::SynchronizeAll();
  return cs::Synced();
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  cs::Called();
  if (ptr == nullptr) return cs::Fail(cudaErrorInvalidValue);
  if (cs::Devices() == 0) return cs::Fail(cudaErrorNoDevice);
  *ptr = bytes == 0 ? nullptr : cs::AllocateGuarded(bytes, cs::MemoryKind::kDevice);
  return bytes == 0 || *ptr != nullptr ? cudaSuccess : cs::Fail(cudaErrorMemoryAllocation);
}

// cudaFree synchronizes the device first, as the runtime does.
cudaError_t cudaFree(void* ptr) {
  cs::Called();
  if (ptr == nullptr) return cudaSuccess;
  cs::Waited();
  cs::SynchronizeAll();
  return cs::FreeGuarded(ptr, cs::MemoryKind::kDevice) ? cs::Synced()
                                                       : cs::Fail(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  cs::Called();
  return cs::MallocHost(ptr, bytes);
}

cudaError_t cs::MallocHost(void** ptr, size_t bytes) {
  if (ptr == nullptr) return cs::Fail(cudaErrorInvalidValue);
  *ptr = bytes == 0 ? nullptr : cs::AllocateGuarded(bytes, cs::MemoryKind::kPinnedHost);
  return bytes == 0 || *ptr != nullptr ? cudaSuccess : cs::Fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  cs::Called();
  if (flags > (cudaHostAllocPortable | cudaHostAllocMapped)) return cs::Fail(cudaErrorInvalidValue);
  return cs::MallocHost(ptr, bytes);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  cs::Called();
  if (attributes == nullptr) return cs::Fail(cudaErrorInvalidValue);
  const cs::Range r = cs::Lookup(ptr);
  void* p = const_cast<void*>(ptr);
  switch (r.kind) {
    case cs::MemoryKind::kDevice:
      *attributes = {cudaMemoryTypeDevice, 0, p, nullptr};
      break;
    case cs::MemoryKind::kPinnedHost:
    case cs::MemoryKind::kRegistered:
      *attributes = {cudaMemoryTypeHost, 0, p, p};
      break;
    default:
      *attributes = {cudaMemoryTypeUnregistered, -1, nullptr, nullptr};
  }
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  cs::Called();
  if (ptr == nullptr) return cudaSuccess;
  cs::Waited();
  cs::SynchronizeAll();
  return cs::FreeGuarded(ptr, cs::MemoryKind::kPinnedHost) ? cs::Synced()
                                                           : cs::Fail(cudaErrorInvalidValue);
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  cs::Called();
  if (flags > (cudaHostRegisterPortable | cudaHostRegisterMapped)) {
    return cs::Fail(cudaErrorInvalidValue);
  }
  return cs::Fail(static_cast<cudaError_t>(cs::RegisterHost(ptr, bytes)));
}

cudaError_t cudaHostUnregister(void* ptr) {
  cs::Called();
  return cs::Fail(static_cast<cudaError_t>(cs::UnregisterHost(ptr)));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  cs::Called();
  if (stream == nullptr || flags > cudaStreamNonBlocking) return cs::Fail(cudaErrorInvalidValue);
  *stream = cs::AddStream(/*blocking=*/flags != cudaStreamNonBlocking);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cs::Called();
  std::shared_ptr<CUstream_st> s = cs::RemoveStream(stream);
  return s != nullptr ? cudaSuccess : cs::Fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cs::Called();
  cs::Waited();
  return cs::StreamSynchronize(stream);
}

cudaError_t cs::StreamSynchronize(cudaStream_t stream) {
  std::shared_ptr<CUstream_st> s = cs::Resolve(stream);
  if (s == nullptr) return cs::Fail(cudaErrorInvalidResourceHandle);
  s->Synchronize();
  return cs::Synced();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  cs::Called();
  std::shared_ptr<CUstream_st> s = cs::Resolve(stream);
  if (s == nullptr || !cs::LiveEvent(event)) return cs::Fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return cs::Fail(cudaErrorInvalidValue);
  std::shared_ptr<cs::EventState> e = event->state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = e->recorded;  // the most recent record at the time of the call
  }
  if (gen == 0) return cudaSuccess;  // never recorded: nothing to wait for
  cs::Submit(*s, cs::Op{[e, gen] {
                          std::unique_lock<std::mutex> lock(e->mu);
                          e->cv.wait(lock, [&] { return e->completed >= gen; });
                        },
                        nullptr, true});
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  cs::Called();
  if (event == nullptr || (flags & ~cudaEventDisableTiming) != 0) {
    return cs::Fail(cudaErrorInvalidValue);
  }
  *event = new CUevent_st;
  cs::AddEvent(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  cs::Called();
  if (!cs::LiveEvent(event)) return cs::Fail(cudaErrorInvalidResourceHandle);
  cs::RemoveEvent(event);
  delete event;  // queued records and waits hold the state
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cs::Called();
  std::shared_ptr<CUstream_st> s = cs::Resolve(stream);
  if (s == nullptr || !cs::LiveEvent(event)) return cs::Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<cs::EventState> e = event->state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = ++e->recorded;
  }
  cs::Submit(*s, cs::Op{[e, gen] {
                          {
                            std::lock_guard<std::mutex> lock(e->mu);
                            if (gen > e->completed) e->completed = gen;
                          }
                          e->cv.notify_all();
                        },
                        nullptr, true});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  cs::Called();
  cs::Count(cs::Counter::kEventQuery);
  if (!cs::LiveEvent(event)) return cs::Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(event->state->mu);
  if (event->state->completed < event->state->recorded) return cs::Fail(cudaErrorNotReady);
  return cs::Sticky() != cudaSuccess ? cs::Fail(cs::Sticky()) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  cs::Called();
  cs::Waited();
  if (!cs::LiveEvent(event)) return cs::Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<cs::EventState> e = event->state;
  std::unique_lock<std::mutex> lock(e->mu);
  const uint64_t gen = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= gen; });
  return cs::Synced();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  cs::Called();
  cs::CopyCalled(1);
  return cs::MemcpyAsync(dst, src, bytes, kind, stream);
}

cudaError_t cs::MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  cs::Side d, s;
  if (!cs::CheckCopy(dst, src, bytes, kind, &d, &s)) return cs::Fail(cudaErrorInvalidValue);
  if (bytes == 0) return cudaSuccess;
  return cs::Issue({cs::Copy{dst, src, bytes, d, s}}, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cs::Called();
  cs::CopyCalled(1);
  cs::Waited();
  const cudaError_t e = cs::MemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  return cs::StreamSynchronize(nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  cs::Called();
  cs::CopyCalled(1);
  // Pitches past the device's cudaDevAttrMaxPitch (2^31 - 1 on current GPUs) are refused.
  constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;
  if (width > dpitch || width > spitch || dpitch > kMaxPitch || spitch > kMaxPitch) {
    return cs::Fail(cudaErrorInvalidValue);
  }
  if (width == 0 || height == 0) return cudaSuccess;
  std::vector<cs::Copy> rows;
  for (size_t r = 0; r < height; ++r) {
    cs::Copy c{static_cast<uint8_t*>(dst) + r * dpitch,
               static_cast<const uint8_t*>(src) + r * spitch,
               width,
               {},
               {}};
    if (!cs::CheckCopy(c.dst, c.src, width, kind, &c.d, &c.s)) {
      return cs::Fail(cudaErrorInvalidValue);
    }
    rows.push_back(c);
  }
  return cs::Issue(std::move(rows), stream);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  cs::Called();
  cs::CopyCalled(1);
  return cs::MemsetAsync(ptr, value, bytes, stream);
}

cudaError_t cs::MemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!cs::DeviceAccessible(ptr, bytes)) return cs::Fail(cudaErrorInvalidValue);
  std::shared_ptr<CUstream_st> s = cs::Resolve(stream);
  if (s == nullptr) return cs::Fail(cudaErrorInvalidResourceHandle);
  cs::Submit(*s, cs::Op{[ptr, value, bytes] {
                          if (cs::DeviceAccessible(ptr, bytes)) {
                            std::memset(ptr, value, bytes);
                          } else {
                            cs::Fault(nullptr, "memset of freed memory", ptr, bytes);
                          }
                        },
                        nullptr, false});
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  cs::Called();
  cs::CopyCalled(1);
  cs::Waited();
  const cudaError_t e = cs::MemsetAsync(ptr, value, bytes, nullptr);
  if (e != cudaSuccess) return e;
  return cs::StreamSynchronize(nullptr);
}

cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                 size_t num_attrs, cudaStream_t stream) {
  cs::Called();
  cs::CopyCalled(count);
  // KVTIER_CUDA_SIM_NO_BATCH=1: a runtime whose driver refuses batches (the fallback path).
  static const bool refuse = std::getenv("KVTIER_CUDA_SIM_NO_BATCH") != nullptr;
  if (refuse) return cs::Fail(cudaErrorNotSupported);
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      attrs_idxs == nullptr || num_attrs == 0 || num_attrs > count || attrs_idxs[0] != 0) {
    return cs::Fail(cudaErrorInvalidValue);
  }
  for (size_t a = 0; a < num_attrs; ++a) {
    if (attrs[a].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid) {
      return cs::Fail(cudaErrorInvalidValue);
    }
  }
  std::vector<cs::Copy> copies;
  for (size_t i = 0; i < count; ++i) {
    cs::Copy c{dsts[i], srcs[i], sizes[i], {}, {}};
    if (sizes[i] == 0 || !cs::CheckCopy(c.dst, c.src, c.bytes, cudaMemcpyDefault, &c.d, &c.s)) {
      return cs::Fail(cudaErrorInvalidValue);
    }
    copies.push_back(c);
  }
  return cs::Issue(std::move(copies), stream);
}
