#ifndef KVTIER_CLIENT_BLOCK_CLIENT_H_
#define KVTIER_CLIENT_BLOCK_CLIENT_H_

// The client of kvtierd's block store (docs/vllm.md): blocks named by content key, shared by the
// engines of one trust domain that open the same space (model and KV layout).
//
//   ASSIGN_OR_RETURN(auto blocks, kvtier::BlockClient::Open(options));
//   if (blocks->Lookup(key)) { ... }                  // no call to kvtierd: the shared table
//   ASSIGN_OR_RETURN(auto grant, blocks->BeginStore(keys));  // slots to write
//   memcpy(blocks->block(grant.slots[i]), src, blocks->block_bytes());
//   RETURN_IF_ERROR(blocks->FinishStore(grant.ticket, /*ok=*/true));  // now visible
//   ASSIGN_OR_RETURN(auto lease, blocks->Acquire(keys));     // never evicted while leased
//   memcpy(dst, blocks->block(lease.slots[i]), blocks->block_bytes());
//   RETURN_IF_ERROR(blocks->Release(lease.ticket));
//
// Lookup is thread-safe and never blocks; the calls are thread-safe and each waits at most
// `timeout` for the daemon. A client whose daemon restarted gets errors from its calls (the
// daemon no longer knows its space) while Lookup may still say yes: Acquire is the authority.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvtier {

struct BlockClientOptions {
  std::string address = "unix:/run/kvtier/kvtierd.sock";  // kvtierd's gRPC socket
  std::string space;  // the namespace: model, dtype, KV layout (1..256 bytes)
  uint64_t block_bytes = 0;
  uint32_t key_bytes = 0;   // 1..64
  uint64_t want_bytes = 0;  // the arena, if this client creates the space (0 = the daemon's)
  absl::Duration timeout = absl::Seconds(2);
  int64_t daemon_uid = -1;  // as in ClientOptions
};

// Slot per key: >= 0, or kvtier::blocks' kPresent (-1), kNoRoom (-2), kMissing (-3).
struct BlockGrant {
  uint64_t ticket = 0;
  std::vector<int64_t> slots;
};

struct BlockStats {
  std::string domain;
  uint64_t space_id = 0, block_slots = 0, daemon_epoch = 0;
  uint64_t published = 0, pending = 0, leased = 0, evictions = 0, stores_no_room = 0,
           owners_dropped = 0;
};

class BlockClient {
 public:
  static absl::StatusOr<std::unique_ptr<BlockClient>> Open(const BlockClientOptions& options);
  virtual ~BlockClient() = default;

  virtual bool Lookup(std::string_view key) const = 0;
  virtual absl::StatusOr<BlockGrant> BeginStore(absl::Span<const std::string> keys) = 0;
  virtual absl::Status FinishStore(uint64_t ticket, bool ok) = 0;
  virtual absl::StatusOr<BlockGrant> Acquire(absl::Span<const std::string> keys) = 0;
  virtual absl::Status Release(uint64_t ticket) = 0;

  // Slot `slot` of the arena (block_bytes() long); null outside it.
  virtual uint8_t* block(int64_t slot) const = 0;
  virtual uint64_t block_bytes() const = 0;
  virtual uint32_t key_bytes() const = 0;
  // The counts of the last reply.
  virtual BlockStats stats() const = 0;
};

}  // namespace kvtier

#endif  // KVTIER_CLIENT_BLOCK_CLIENT_H_
