#include "daemon/shm_segment.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::daemon {
namespace bip = boost::interprocess;

struct ShmSegment::Mapping {
  bip::shared_memory_object shm;
  bip::mapped_region region;
};

namespace {

absl::Status FromBoost(const bip::interprocess_exception& e, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", e.what());
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return absl::AlreadyExistsError(msg);
    case bip::not_found_error:
      return absl::NotFoundError(msg);
    case bip::security_error:
      return absl::PermissionDeniedError(msg);
    case bip::out_of_memory_error:
    case bip::out_of_space_error:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 250) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name \"", name, "\" must be \"/<name>\" without further slashes"));
  }
  return absl::OkStatus();
}

// Applies mode (independent of the umask) and group to the segment's file descriptor.
absl::Status ApplyOwnership(bip::shared_memory_object& shm, const ShmSegmentOptions& o) {
  int fd = shm.get_mapping_handle().handle;
  if (!o.group.empty()) {
    struct group grp_buf;
    struct group* grp = nullptr;
    char buf[4096];
    int rc = getgrnam_r(o.group.c_str(), &grp_buf, buf, sizeof(buf), &grp);
    if (rc != 0 || grp == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("shm_group \"", o.group, "\" not found"));
    }
    if (fchown(fd, static_cast<uid_t>(-1), grp->gr_gid) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("chown shm to group \"", o.group, "\": ", std::strerror(errno)));
    }
  }
  if (fchmod(fd, static_cast<mode_t>(o.mode & 07777)) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("chmod shm ", o.name, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

ShmSegment::ShmSegment(std::unique_ptr<Mapping> mapping, std::string name, bool owner)
    : mapping_(std::move(mapping)), name_(std::move(name)), owner_(owner) {
  base_ = static_cast<uint8_t*>(mapping_->region.get_address());
  size_ = mapping_->region.get_size();
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : mapping_(std::move(other.mapping_)),
      name_(std::move(other.name_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    mapping_ = std::move(other.mapping_);
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  mapping_.reset();  // unmaps
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
  owner_ = false;
  base_ = nullptr;
  size_ = 0;
}

absl::StatusOr<ShmSegment> ShmSegment::Create(const ShmSegmentOptions& o) {
  if (absl::Status s = ValidateName(o.name); !s.ok()) return s;
  if (o.total_bytes <= layout::kPoolDataOffset) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool size ", o.total_bytes, " must exceed ", layout::kPoolDataOffset));
  }
  auto mapping = std::make_unique<Mapping>();
  bool created = false;
  try {
    bip::permissions perm(o.mode & 0777);
    mapping->shm =
        bip::shared_memory_object(bip::create_only, o.name.c_str(), bip::read_write, perm);
    created = true;
    if (absl::Status s = ApplyOwnership(mapping->shm, o); !s.ok()) {
      bip::shared_memory_object::remove(o.name.c_str());
      return s;
    }
    mapping->shm.truncate(static_cast<bip::offset_t>(o.total_bytes));
    mapping->region = bip::mapped_region(mapping->shm, bip::read_write, 0, o.total_bytes);
  } catch (const bip::interprocess_exception& e) {
    if (created) bip::shared_memory_object::remove(o.name.c_str());
    return FromBoost(e, absl::StrCat("create shm ", o.name));
  }
  ShmSegment segment(std::move(mapping), o.name, /*owner=*/true);
  layout::PoolHeader header = layout::MakePoolHeader(
      o.kind, o.total_bytes, o.daemon_epoch, static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  std::memcpy(segment.base_, &header, sizeof(header));
  return segment;
}

absl::StatusOr<ShmSegment> ShmSegment::Open(const std::string& name, layout::PoolKind kind) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  auto mapping = std::make_unique<Mapping>();
  try {
    mapping->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    mapping->region = bip::mapped_region(mapping->shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, absl::StrCat("open shm ", name));
  }
  ShmSegment segment(std::move(mapping), name, /*owner=*/false);
  if (segment.size_ < sizeof(layout::PoolHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ", name, " is ", segment.size_, " bytes, smaller than a pool header"));
  }
  layout::PoolHeader header;
  std::memcpy(&header, segment.base_, sizeof(header));
  if (absl::Status s = layout::ValidatePoolHeader(header, kind, segment.size_); !s.ok()) return s;
  return segment;
}

}  // namespace kvtier::daemon
