#ifndef KVTIER_WORKER_KERNELS_COPY_CPU_H_
#define KVTIER_WORKER_KERNELS_COPY_CPU_H_

// Page copies between tiers. Thread-safe (no state).

#include <cstddef>

namespace kvtier::worker::kernels {

// Copies `bytes` from src to dst (non-overlapping). With AVX2 and a 32-byte aligned dst it uses
// non-temporal stores: a page moved between tiers is not read again right away, and streaming
// stores skip the read-for-ownership that halves the bandwidth of cached stores. Falls back to
// memcpy otherwise. The bytes written are identical either way.
void CopyPage(void* dst, const void* src, size_t bytes);

}  // namespace kvtier::worker::kernels

#endif  // KVTIER_WORKER_KERNELS_COPY_CPU_H_
