#include "core/layout/shm_abi.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::layout {

PoolHeader MakePoolHeader(PoolKind kind, uint64_t extent_bytes, uint64_t max_extents,
                          uint64_t worker_id, uint64_t daemon_epoch, uint64_t created_unix_ns) {
  PoolHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kPoolMagic;
  h.abi_version = kPoolAbiVersion;
  h.kind = static_cast<uint32_t>(kind);
  h.header_bytes = sizeof(PoolHeader);
  h.extent_bytes = extent_bytes;
  h.max_extents = max_extents;
  h.worker_id = worker_id;
  h.daemon_epoch = daemon_epoch;
  h.created_unix_ns = created_unix_ns;
  return h;
}

absl::Status ValidatePoolHeader(const PoolHeader& h, PoolKind expected_kind, uint64_t extent_bytes,
                                uint64_t max_extents, uint64_t worker_id) {
  auto bad = [](const char* field, uint64_t got, uint64_t want) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool header: ", field, " is ", got, ", expected ", want));
  };
  if (h.magic != kPoolMagic) return bad("magic", h.magic, kPoolMagic);
  if (h.abi_version != kPoolAbiVersion) return bad("abi_version", h.abi_version, kPoolAbiVersion);
  if (h.kind != static_cast<uint32_t>(expected_kind)) {
    return bad("kind", h.kind, static_cast<uint32_t>(expected_kind));
  }
  if (h.header_bytes != sizeof(PoolHeader)) {
    return bad("header_bytes", h.header_bytes, sizeof(PoolHeader));
  }
  if (h.extent_bytes != extent_bytes) return bad("extent_bytes", h.extent_bytes, extent_bytes);
  if (h.extent_bytes == 0 || h.extent_bytes % kSlotAlignment != 0) {
    return bad("extent_bytes (a positive multiple of 256)", h.extent_bytes, extent_bytes);
  }
  if (h.max_extents != max_extents) return bad("max_extents", h.max_extents, max_extents);
  if (h.worker_id != worker_id) return bad("worker_id", h.worker_id, worker_id);
  return absl::OkStatus();
}

}  // namespace kvtier::layout
