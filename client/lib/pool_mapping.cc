#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "absl/strings/str_cat.h"
#include "core/layout/shm_abi.h"
#include "kvtier/client.h"

namespace kvtier {
namespace {

namespace bip = boost::interprocess;

class BoostPoolMapping final : public PoolMapping {
 public:
  BoostPoolMapping(v1::PoolKind kind, bip::mapped_region region, uint64_t data_offset,
                   uint64_t epoch)
      : kind_(kind), region_(std::move(region)), data_offset_(data_offset), epoch_(epoch) {}
  v1::PoolKind kind() const override { return kind_; }
  uint8_t* data() const override {
    return static_cast<uint8_t*>(region_.get_address()) + data_offset_;
  }
  uint64_t data_bytes() const override { return region_.get_size() - data_offset_; }
  uint64_t epoch() const override { return epoch_; }

 private:
  const v1::PoolKind kind_;
  bip::mapped_region region_;
  const uint64_t data_offset_;
  const uint64_t epoch_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<PoolMapping>> MapPool(const v1::PoolDescriptor& d) {
  const auto kind =
      d.kind() == v1::POOL_KIND_DDR ? layout::PoolKind::kDdr : layout::PoolKind::kCompressed;
  if (d.kind() != v1::POOL_KIND_DDR && d.kind() != v1::POOL_KIND_COMPRESSED) {
    return absl::InvalidArgumentError(absl::StrCat("pool kind ", d.kind(), " is unknown"));
  }
  try {
    // Boost wants the name without the leading slash that shm_open uses.
    std::string name = d.shm_name();
    if (!name.empty() && name[0] == '/') name.erase(0, 1);
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    shm.get_size(size);
    if (static_cast<uint64_t>(size) != d.size_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool ", d.shm_name(), " is ", size, " bytes, descriptor says ", d.size_bytes()));
    }
    bip::mapped_region region(shm, bip::read_write);
    const auto* header = static_cast<const layout::PoolHeader*>(region.get_address());
    absl::Status valid = layout::ValidatePoolHeader(*header, kind, region.get_size());
    if (!valid.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(d.shm_name(), ": ", valid.message()));
    }
    uint64_t epoch = header->daemon_epoch;
    return std::shared_ptr<PoolMapping>(std::make_shared<BoostPoolMapping>(
        d.kind(), std::move(region), header->data_offset, epoch));
  } catch (const bip::interprocess_exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot map pool ", d.shm_name(), ": ", e.what()));
  }
}

}  // namespace kvtier
