#include "worker/local_tiers.h"

#include <vector>

#include "core/status/status_macros.h"

namespace kvtier::worker {

absl::StatusOr<std::unique_ptr<LocalTiers>> LocalTiers::Create(const LocalTiersOptions& options) {
  if (options.arena_bytes == 0) {
    return absl::InvalidArgumentError("arena_bytes must be positive, got 0");
  }
  std::unique_ptr<LocalTiers> t(new LocalTiers());
  t->arena_ = std::make_unique<HostArena>(options.arena_bytes);
  std::vector<LocalSlotAllocator::PoolSpec> specs;
  if (options.ddr_bytes > 0) {
    ASSIGN_OR_RETURN(t->ddr_, HostPagePool::Create(PoolKind::kDdr, options.ddr_bytes));
    specs.push_back({PoolKind::kDdr, options.ddr_bytes});
  }
  if (options.compressed_bytes > 0) {
    ASSIGN_OR_RETURN(t->compressed_,
                     HostPagePool::Create(PoolKind::kCompressed, options.compressed_bytes));
    specs.push_back({PoolKind::kCompressed, options.compressed_bytes});
  }
  t->slots_ = std::make_unique<LocalSlotAllocator>(specs);
  return t;
}

}  // namespace kvtier::worker
