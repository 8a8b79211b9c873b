#ifndef KVTIER_TESTS_INTEGRATION_SUPPORT_POOL_MEMORY_FIGURES_H_
#define KVTIER_TESTS_INTEGRATION_SUPPORT_POOL_MEMORY_FIGURES_H_

// The kernel's own figures for a daemon's pool memory, to set beside the daemon's counters:
// extents are memfd pages (shmem), and a process that keeps an extent's descriptor or mapping
// keeps its pages alive whatever the daemon's books say. Not thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::testing {

// Bytes of the distinct memfd segments named exactly `name` (a pool's label: the shm prefix
// without its '/', then "-ddr" or "-cmp") that processes `pids` hold open or mapped, each segment
// counted once (by inode) at the size the kernel gives it (st_blocks of an open one, else the
// length mapped). Processes that are gone count nothing.
uint64_t MemfdBytesHeld(const std::vector<pid_t>& pids, const std::string& name);

// A memory cgroup of its own (v2, or v1's memory controller) for the processes started while
// this process is inside it (Enter ... Leave): shmem pages are charged to the cgroup of the
// process that allocated them, so its memory.stat `shmem` counts every pool page a daemon
// started inside made that is still alive anywhere, mapped by whomever.
class ShmemCgroup {
 public:
  // Under this process's memory cgroup; UNAVAILABLE where none can be made (not root, no memory
  // controller, a read-only cgroupfs).
  static absl::StatusOr<std::unique_ptr<ShmemCgroup>> Create(const std::string& name);
  // Removes the cgroup (its processes must have exited).
  ~ShmemCgroup();

  absl::Status Enter();  // moves this process in
  absl::Status Leave();  // and back where it was
  uint64_t ShmemBytes() const;
  const std::string& path() const { return path_; }

 private:
  ShmemCgroup(std::string path, std::string parent) : path_(path), parent_(parent) {}
  std::string path_, parent_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_SUPPORT_POOL_MEMORY_FIGURES_H_
