#ifndef KVTIER_DAEMON_BLOCK_OPTIONS_H_
#define KVTIER_DAEMON_BLOCK_OPTIONS_H_

// [blocks] of deploy/kvtierd.toml: the node-wide block store engines share by content key
// (daemon/block_index.h, docs/vllm.md).

#include <cstdint>
#include <vector>

namespace kvtier::daemon {

struct BlockOptions {
  // Bytes all block spaces together may take (0 = the block store is off). A reservation beside
  // pools.ddr_mib, not carved from it.
  uint64_t budget_bytes = 0;
  // The arena of a space whose opener asks for no size.
  uint64_t space_bytes = 256ull << 20;
  // These uids share one trust domain ("shared"); every other uid is a domain of its own, so that
  // blocks (a timing and content side channel) never cross uids unless the operator says so.
  std::vector<uint32_t> shared_uids;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCK_OPTIONS_H_
