#include "core/layout/shm_abi.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::layout {

PoolHeader MakePoolHeader(PoolKind kind, uint64_t total_bytes, uint64_t daemon_epoch,
                          uint64_t created_unix_ns) {
  PoolHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kPoolMagic;
  h.abi_version = kPoolAbiVersion;
  h.kind = static_cast<uint32_t>(kind);
  h.header_bytes = sizeof(PoolHeader);
  h.total_bytes = total_bytes;
  h.data_offset = kPoolDataOffset;
  h.data_bytes = total_bytes > kPoolDataOffset ? total_bytes - kPoolDataOffset : 0;
  h.daemon_epoch = daemon_epoch;
  h.created_unix_ns = created_unix_ns;
  return h;
}

absl::Status ValidatePoolHeader(const PoolHeader& h, PoolKind expected_kind,
                                uint64_t mapped_bytes) {
  auto bad = [](const char* field, uint64_t got, uint64_t want) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool header: ", field, " is ", got, ", expected ", want));
  };
  if (h.magic != kPoolMagic) return bad("magic", h.magic, kPoolMagic);
  if (h.abi_version != kPoolAbiVersion) return bad("abi_version", h.abi_version, kPoolAbiVersion);
  if (h.kind != static_cast<uint32_t>(expected_kind)) {
    return bad("kind", h.kind, static_cast<uint32_t>(expected_kind));
  }
  if (h.total_bytes != mapped_bytes) return bad("total_bytes", h.total_bytes, mapped_bytes);
  if (h.data_offset != kPoolDataOffset) return bad("data_offset", h.data_offset, kPoolDataOffset);
  if (h.data_offset + h.data_bytes > h.total_bytes) {
    return bad("data_bytes", h.data_bytes, h.total_bytes - h.data_offset);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::layout
