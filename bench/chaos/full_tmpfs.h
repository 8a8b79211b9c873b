#ifndef KVTIER_BENCH_CHAOS_FULL_TMPFS_H_
#define KVTIER_BENCH_CHAOS_FULL_TMPFS_H_

// A tmpfs of a fixed size for the pools' extents (pools.extent_dir), mounted in a mount
// namespace private to this process and the children it starts afterwards (so nothing outside
// sees it or has to clean it up), and a filler file that takes up whatever room is left on
// demand: the "full tmpfs" fault of kvtier-chaos. Not thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::testing {

class FullTmpfs {
 public:
  // Enters a private mount namespace and mounts a tmpfs of `bytes` at `dir` (created).
  // FAILED_PRECONDITION saying why when this host does not allow it (not root, no namespaces).
  static absl::StatusOr<std::unique_ptr<FullTmpfs>> Mount(const std::string& dir, uint64_t bytes);
  ~FullTmpfs();  // unmounts

  const std::string& dir() const { return dir_; }
  // Grows the filler by the room that is left, so that the next extent finds none; call it
  // again to keep the tmpfs full while extents come and go. Returns the bytes free afterwards.
  absl::StatusOr<uint64_t> Fill();
  // Removes the filler: the room is back.
  void Drain();

 private:
  explicit FullTmpfs(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  int filler_ = -1;
};

}  // namespace kvtier::testing

#endif  // KVTIER_BENCH_CHAOS_FULL_TMPFS_H_
