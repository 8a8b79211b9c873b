#include "client/lib/extent_mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/layout/shm_abi.h"
#include "core/status/status_macros.h"
#include "edge/memory_channel.h"

namespace kvtier::internal {
namespace {

layout::PoolKind LayoutKind(v1::PoolKind k) {
  return k == v1::POOL_KIND_DDR ? layout::PoolKind::kDdr : layout::PoolKind::kCompressed;
}

const char* PoolName(v1::PoolKind k) { return k == v1::POOL_KIND_DDR ? "DDR" : "compressed"; }

absl::StatusOr<std::unique_ptr<edge::cuda::VmmRange>> ReserveVmm(
    const v1::PoolDescriptor& d,
    const absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>>& cuda) {
  absl::StatusOr<std::unique_ptr<edge::cuda::VmmRange>> range =
      !cuda.ok()         ? absl::StatusOr<std::unique_ptr<edge::cuda::VmmRange>>(cuda.status())
      : *cuda == nullptr ? absl::FailedPreconditionError("no CUDA driver loaded")
                         : edge::cuda::VmmRange::Reserve(cuda->get(), d.size_bytes(),
                                                         d.extent_bytes(), d.numa_node());
  if (!range.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(PoolName(d.kind()), " pool is CUDA VMM memory: ", range.status().message()));
  }
  return range;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ExtentMapping>> ExtentMapping::Reserve(
    const v1::PoolDescriptor& d, uint64_t worker_id, uint64_t epoch,
    absl::StatusOr<std::shared_ptr<const edge::cuda::Driver>> cuda) {
  if (d.kind() != v1::POOL_KIND_DDR && d.kind() != v1::POOL_KIND_COMPRESSED) {
    return absl::InvalidArgumentError(absl::StrCat("pool kind ", d.kind(), " is unknown"));
  }
  if (d.abi_version() != layout::kPoolAbiVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool abi_version ", d.abi_version(), ", this client speaks ", layout::kPoolAbiVersion));
  }
  if (d.extent_bytes() == 0 || d.extent_bytes() % 4096 != 0 || d.max_extents() == 0 ||
      d.size_bytes() != d.extent_bytes() * d.max_extents()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool descriptor: extent_bytes ", d.extent_bytes(), " x max_extents ", d.max_extents(),
        " must be positive, page-aligned and equal size_bytes ", d.size_bytes()));
  }
  if (d.memory() == v1::POOL_MEMORY_CUDA_VMM) {
    ASSIGN_OR_RETURN(std::unique_ptr<edge::cuda::VmmRange> range, ReserveVmm(d, cuda));
    uint8_t* base = range->base();
    return std::shared_ptr<ExtentMapping>(new ExtentMapping(d.kind(), base, d.extent_bytes(),
                                                            d.max_extents(), worker_id, epoch,
                                                            *std::move(cuda), std::move(range)));
  }
  if (d.memory() != v1::POOL_MEMORY_MEMFD && d.memory() != v1::POOL_MEMORY_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat("pool memory ", d.memory(), " is unknown"));
  }
  void* base =
      mmap(nullptr, d.size_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", d.size_bytes(), " bytes of address space: ", std::strerror(errno)));
  }
  return std::shared_ptr<ExtentMapping>(new ExtentMapping(d.kind(), static_cast<uint8_t*>(base),
                                                          d.extent_bytes(), d.max_extents(),
                                                          worker_id, epoch, nullptr, nullptr));
}

ExtentMapping::~ExtentMapping() {
  if (vmm_ == nullptr) munmap(base_, data_bytes());  // a VMM range frees itself
}

std::string ExtentMapping::vmm_failure() const {
  absl::MutexLock lock(&mu_);
  return vmm_failure_;
}

absl::Status ExtentMapping::CheckHeader(int fd) {
  void* h = mmap(nullptr, layout::kPoolHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map pool header: ", std::strerror(errno)));
  }
  layout::PoolHeader header;
  std::memcpy(&header, h, sizeof(header));
  munmap(h, layout::kPoolHeaderBytes);
  RETURN_IF_ERROR(layout::ValidatePoolHeader(header, LayoutKind(kind_), extent_bytes_, max_extents_,
                                             worker_id_));
  header_checked_ = true;
  return absl::OkStatus();
}

absl::Status ExtentMapping::CheckDescriptors(const std::vector<edge::UniqueFd>& fds,
                                             uint32_t first) const {
  RETURN_IF_ERROR(
      edge::CheckExtentDescriptor(fds[0].get(), absl::StrCat(PoolName(kind_), " pool header"),
                                  edge::DescriptorKind::kSealedHeader, layout::kPoolHeaderBytes));
  const edge::DescriptorKind kind =
      vmm_ != nullptr ? edge::DescriptorKind::kCudaVmm : edge::DescriptorKind::kMemfd;
  for (size_t i = 1; i < fds.size(); ++i) {
    RETURN_IF_ERROR(edge::CheckExtentDescriptor(
        fds[i].get(), absl::StrCat(PoolName(kind_), " pool extent ", first + i - 1), kind,
        extent_bytes_));
  }
  return absl::OkStatus();
}

absl::Status ExtentMapping::MapExtent(int fd, uint32_t index) {
  const uint64_t offset = uint64_t{index} * extent_bytes_;
  if (vmm_ != nullptr) {
    absl::Status s = vmm_->MapAt(fd, offset, extent_bytes_);
    if (!s.ok()) {
      vmm_failure_ = absl::StrCat(PoolName(kind_), " pool extent ", index, ": ", s.message());
      return absl::Status(s.code(), vmm_failure_);
    }
    return absl::OkStatus();
  }
  void* got =
      mmap(base_ + offset, extent_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (got == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map extent ", index, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ExtentMapping::Grow(uint32_t n, const std::string& channel_path,
                                 const std::string& secret, const edge::DaemonUids& daemon) {
  if (n > max_extents_) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan needs ", n, " extents, more than the ", max_extents_, " reserved"));
  }
  absl::MutexLock lock(&mu_);
  while (mapped_.load(std::memory_order_relaxed) < n || !header_checked_) {
    const uint32_t have = mapped_.load(std::memory_order_relaxed);
    v1::ChannelRequest request;
    v1::FetchExtents* fetch = request.mutable_fetch_extents();
    fetch->set_worker_id(worker_id_);
    fetch->set_session_secret(secret);
    fetch->set_kind(kind_);
    fetch->set_first_extent(have);
    std::vector<edge::UniqueFd> fds;
    ASSIGN_OR_RETURN(v1::ChannelReply reply,
                     edge::ChannelCall(channel_path, request, &fds, absl::Seconds(2), &daemon));
    if (fds.size() != size_t{reply.extent_count()} + 1 || reply.first_extent() != have) {
      return absl::InternalError(absl::StrCat("memory channel sent ", fds.size(),
                                              " descriptors for ", reply.extent_count(),
                                              " extents from ", reply.first_extent()));
    }
    if (uint64_t{have} + reply.extent_count() > max_extents_) {
      return absl::InternalError(absl::StrCat("memory channel sent extents up to ",
                                              have + reply.extent_count(), ", past the ",
                                              max_extents_, " reserved"));
    }
    RETURN_IF_ERROR(CheckDescriptors(fds, have));
    if (!header_checked_) RETURN_IF_ERROR(CheckHeader(fds[0].get()));
    if (reply.extent_count() == 0 && have < n) {
      return absl::FailedPreconditionError(absl::StrCat("the daemon holds ", reply.total_extents(),
                                                        " extents for this worker, the plan needs ",
                                                        n));
    }
    for (uint32_t i = 0; i < reply.extent_count(); ++i) {
      RETURN_IF_ERROR(MapExtent(fds[i + 1].get(), have + i));
      mapped_.store(have + i + 1, std::memory_order_release);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier::internal
