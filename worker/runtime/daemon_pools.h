#ifndef KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_
#define KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_

// The store's view of one of the daemon's pools as the client maps it: the same range, and
// whether the daemon's memory is already pinned and device-mapped (CUDA VMM), which a CUDA
// backend then borrows instead of registering it again.

#include <memory>

#include "kvtier/client.h"
#include "worker/page_pool.h"

namespace kvtier::worker {

inline std::unique_ptr<ExternalPagePool> PoolOverMapping(PoolKind kind,
                                                         const PoolMapping& mapping) {
  return std::make_unique<ExternalPagePool>(kind, mapping.data(), mapping.data_bytes(),
                                            mapping.device_mapped());
}

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_DAEMON_POOLS_H_
