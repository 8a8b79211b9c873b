#ifndef KVTIER_DAEMON_BLOCK_INDEX_H_
#define KVTIER_DAEMON_BLOCK_INDEX_H_

// The daemon's node-wide block store (docs/vllm.md): per trust domain and namespace ("space"),
// an arena of fixed-size blocks that every engine of the domain maps, a shared table the daemon
// writes and they read without calling it, and the index (core/blocks/block_space.h) that decides
// which slot holds which key, who is writing it and who is reading it. Answers the memory
// channel's block requests. Writers and readers are processes (pidfds): what a process held goes
// when it exits (ReapExited), and nothing another process reads goes with it.
//
// Thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/blocks/block_space.h"
#include "daemon/block_options.h"
#include "daemon/extent.h"
#include "edge/memory_channel.h"
#include "edge/peer_process.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

class BlockMetrics;
class Metrics;

class BlockIndex {
 public:
  // `allowed` says whether a peer may use the daemon at all ([security]); `label` names the
  // memfds (/proc/PID/maps); `metrics` (may be null) hears what the spaces did.
  using AllowFn = std::function<absl::Status(const edge::PeerCredentials&)>;
  BlockIndex(BlockOptions options, std::string label, uint64_t daemon_epoch, Metrics* metrics,
             AllowFn allowed);
  ~BlockIndex();
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  static bool Handles(const v1::ChannelRequest& request);
  // Answers one block request; BlockOpen's reply carries [table, arena] in `*fds`.
  absl::StatusOr<v1::ChannelReply> Handle(const edge::PeerCredentials& peer,
                                          const v1::ChannelRequest& request,
                                          std::vector<edge::UniqueFd>* fds);
  // Drops what exited processes held (pending stores, leases). Returns how many it dropped.
  int ReapExited();

 private:
  struct Space;
  std::string DomainOf(const edge::PeerCredentials& peer) const;
  absl::StatusOr<Space*> Find(const edge::PeerCredentials& peer, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Space*> Open(const edge::PeerCredentials& peer, const v1::BlockOpen& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<blocks::OwnerId> OwnerOf(const edge::PeerCredentials& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<std::string>> Keys(
      const Space& space, const google::protobuf::RepeatedPtrField<std::string>& keys) const;
  int ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the metrics what the spaces' figures moved since the last report.
  void ReportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BlockOptions options_;
  const std::string label_;
  const uint64_t daemon_epoch_;
  const AllowFn allowed_;
  BlockMetrics* const metrics_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Space>> spaces_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<blocks::OwnerId, std::shared_ptr<const edge::PeerProcess>> owners_
      ABSL_GUARDED_BY(mu_);
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_space_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCK_INDEX_H_
