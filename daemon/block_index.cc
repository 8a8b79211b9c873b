#include "daemon/block_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "daemon/metrics.h"

namespace kvtier::daemon {
namespace {

constexpr size_t kMaxSpaceName = 256;
constexpr int kMaxKeysPerRequest = 1024;  // a request and its reply fit one datagram
constexpr uint64_t kMinBlocksPerSpace = 16;
constexpr char kSharedDomain[] = "shared";  // the uids of [blocks] shared_uids

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

struct BlockIndex::Space {
  uint64_t id = 0;
  std::string domain;
  uint64_t block_bytes = 0;
  uint32_t key_bytes = 0;
  uint64_t slots = 0;
  Extent arena;
  edge::UniqueFd table_fd;
  uint8_t* table = nullptr;
  uint64_t table_bytes = 0;
  blocks::BlockTableWriter writer;
  std::unique_ptr<blocks::BlockSpace> index;
  blocks::BlockSpaceStats reported;  // what the metrics have heard of

  explicit Space(Extent a) : arena(std::move(a)) {}
  ~Space() {
    if (table != nullptr) munmap(table, table_bytes);
  }
};

BlockIndex::BlockIndex(BlockOptions options, std::string label, uint64_t daemon_epoch,
                       Metrics* metrics, AllowFn allowed)
    : options_(std::move(options)),
      label_(std::move(label)),
      daemon_epoch_(daemon_epoch),
      allowed_(std::move(allowed)),
      metrics_(metrics != nullptr ? &metrics->blocks() : nullptr) {}

BlockIndex::~BlockIndex() = default;

bool BlockIndex::Handles(const v1::ChannelRequest& request) {
  switch (request.op_case()) {
    case v1::ChannelRequest::kBlockOpen:
    case v1::ChannelRequest::kBlockStore:
    case v1::ChannelRequest::kBlockFinish:
    case v1::ChannelRequest::kBlockAcquire:
    case v1::ChannelRequest::kBlockRelease:
      return true;
    default:
      return false;
  }
}

std::string BlockIndex::DomainOf(const edge::PeerCredentials& peer) const {
  if (std::find(options_.shared_uids.begin(), options_.shared_uids.end(), peer.uid) !=
      options_.shared_uids.end()) {
    return kSharedDomain;
  }
  return absl::StrCat("uid:", peer.uid);
}

absl::StatusOr<blocks::OwnerId> BlockIndex::OwnerOf(const edge::PeerCredentials& peer) {
  // Pending stores and leases belong to a process: without a pidfd the daemon could not tell
  // when it died, and what it held would leak.
  if (peer.process == nullptr || peer.process->id() == 0) {
    return absl::FailedPreconditionError(
        "block requests need the peer's pidfd (SO_PEERPIDFD or pidfd_open, Linux 6.9+)");
  }
  owners_.try_emplace(peer.process->id(), peer.process);
  return peer.process->id();
}

absl::StatusOr<BlockIndex::Space*> BlockIndex::Find(const edge::PeerCredentials& peer,
                                                    const std::string& name) {
  auto it = spaces_.find({DomainOf(peer), name});
  if (it == spaces_.end()) {
    return absl::NotFoundError(absl::StrCat("no block space \"", name, "\" in domain ",
                                            DomainOf(peer), " (BlockOpen first)"));
  }
  return it->second.get();
}

absl::StatusOr<BlockIndex::Space*> BlockIndex::Open(const edge::PeerCredentials& peer,
                                                    const v1::BlockOpen& r) {
  if (r.space().empty() || r.space().size() > kMaxSpaceName) {
    return absl::InvalidArgumentError(absl::StrCat("BlockOpen.space of ", r.space().size(),
                                                   " bytes; must be 1..", kMaxSpaceName));
  }
  if (r.key_bytes() == 0 || r.key_bytes() > blocks::kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("BlockOpen.key_bytes = ", r.key_bytes(),
                                                   "; must be 1..", blocks::kMaxKeyBytes));
  }
  const std::string domain = DomainOf(peer);
  if (auto it = spaces_.find({domain, r.space()}); it != spaces_.end()) {
    Space* s = it->second.get();
    if (s->block_bytes != r.block_bytes() || s->key_bytes != r.key_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block space \"", r.space(), "\" has block_bytes = ", s->block_bytes, " and key_bytes = ",
          s->key_bytes, "; BlockOpen asked ", r.block_bytes(), " and ", r.key_bytes()));
    }
    return s;
  }
  const uint64_t want = r.want_bytes() != 0 ? r.want_bytes() : options_.space_bytes;
  if (r.block_bytes() == 0 || r.block_bytes() > want / kMinBlocksPerSpace) {
    return absl::InvalidArgumentError(absl::StrCat("BlockOpen.block_bytes = ", r.block_bytes(),
                                                   "; a space of ", want, " bytes holds at least ",
                                                   kMinBlocksPerSpace, " blocks, so at most ",
                                                   want / kMinBlocksPerSpace));
  }
  const uint64_t slots = want / r.block_bytes();
  const uint64_t arena_bytes = (slots * r.block_bytes() + 4095) / 4096 * 4096;
  const uint64_t table_bytes = blocks::BlockTableBytes(blocks::BlockTableBuckets(slots));
  if (reserved_bytes_ + arena_bytes + table_bytes > options_.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a block space of ", arena_bytes + table_bytes, " bytes does not fit: ", reserved_bytes_,
        " of blocks.mib (", options_.budget_bytes, " bytes) are taken"));
  }
  const uint64_t id = next_space_id_++;
  ASSIGN_OR_RETURN(Extent arena,
                   Extent::Create(absl::StrCat(label_, "-blocks-", id), arena_bytes, ""));
  auto space = std::make_unique<Space>(std::move(arena));
  space->id = id;
  space->domain = domain;
  space->block_bytes = r.block_bytes();
  space->key_bytes = r.key_bytes();
  space->slots = slots;
  space->table_bytes = table_bytes;
  // The table: the daemon keeps the one writable mapping; the seal refuses any later one, and
  // workers get a read-only descriptor besides.
  const std::string name = absl::StrCat(label_, "-blocktable-", id);
  space->table_fd.Reset(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!space->table_fd.valid()) return Errno("memfd_create(block table)");
  if (ftruncate(space->table_fd.get(), static_cast<off_t>(table_bytes)) != 0) {
    return Errno("ftruncate(block table)");
  }
  void* map =
      mmap(nullptr, table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, space->table_fd.get(), 0);
  if (map == MAP_FAILED) return Errno("mmap(block table)");
  space->table = static_cast<uint8_t*>(map);
  if (fcntl(space->table_fd.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return Errno("sealing the block table");
  }
  const blocks::BlockTableHeader h =
      blocks::NewBlockTableHeader(slots, r.key_bytes(), r.block_bytes(), daemon_epoch_, id);
  space->writer = blocks::BlockTableWriter(space->table, h);
  space->index = std::make_unique<blocks::BlockSpace>(slots, &space->writer);
  reserved_bytes_ += arena_bytes + table_bytes;
  Space* raw = space.get();
  spaces_.emplace(std::make_pair(domain, r.space()), std::move(space));
  return raw;
}

absl::StatusOr<std::vector<std::string>> BlockIndex::Keys(
    const Space& space, const google::protobuf::RepeatedPtrField<std::string>& keys) const {
  if (keys.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys in one request; at most ", kMaxKeysPerRequest));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (int i = 0; i < keys.size(); ++i) {
    if (keys[i].size() != space.key_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("keys[", i, "] has ", keys[i].size(),
                                                     " bytes; this space's keys have ",
                                                     space.key_bytes));
    }
    out.push_back(keys[i]);
  }
  return out;
}

absl::StatusOr<v1::ChannelReply> BlockIndex::Handle(const edge::PeerCredentials& peer,
                                                    const v1::ChannelRequest& request,
                                                    std::vector<edge::UniqueFd>* fds) {
  RETURN_IF_ERROR(allowed_(peer));
  if (options_.budget_bytes == 0) {
    return absl::FailedPreconditionError("the block store is off (blocks.mib = 0)");
  }
  absl::MutexLock lock(&mu_);
  ReapLocked();
  ASSIGN_OR_RETURN(blocks::OwnerId owner, OwnerOf(peer));
  Space* space = nullptr;
  v1::ChannelReply reply;
  v1::BlockReply& out = *reply.mutable_block();
  blocks::BlockTicket ticket;
  switch (request.op_case()) {
    case v1::ChannelRequest::kBlockOpen: {
      ASSIGN_OR_RETURN(space, Open(peer, request.block_open()));
      ASSIGN_OR_RETURN(edge::UniqueFd arena, space->arena.Share());
      edge::UniqueFd table(open(absl::StrCat("/proc/self/fd/", space->table_fd.get()).c_str(),
                                O_RDONLY | O_CLOEXEC));
      if (!table.valid()) return Errno("reopening the block table read-only");
      fds->push_back(std::move(table));
      fds->push_back(std::move(arena));
      break;
    }
    case v1::ChannelRequest::kBlockStore: {
      ASSIGN_OR_RETURN(space, Find(peer, request.block_store().space()));
      ASSIGN_OR_RETURN(std::vector<std::string> keys, Keys(*space, request.block_store().keys()));
      ticket = space->index->BeginStore(owner, keys);
      break;
    }
    case v1::ChannelRequest::kBlockFinish: {
      const v1::BlockFinish& f = request.block_finish();
      ASSIGN_OR_RETURN(space, Find(peer, f.space()));
      RETURN_IF_ERROR(space->index->FinishStore(owner, f.ticket(), f.ok()));
      break;
    }
    case v1::ChannelRequest::kBlockAcquire: {
      ASSIGN_OR_RETURN(space, Find(peer, request.block_acquire().space()));
      ASSIGN_OR_RETURN(std::vector<std::string> keys, Keys(*space, request.block_acquire().keys()));
      ticket = space->index->Acquire(owner, keys);
      break;
    }
    case v1::ChannelRequest::kBlockRelease: {
      ASSIGN_OR_RETURN(space, Find(peer, request.block_release().space()));
      RETURN_IF_ERROR(space->index->Release(owner, request.block_release().ticket()));
      break;
    }
    default:
      return absl::InvalidArgumentError("not a block request");
  }
  out.set_domain(space->domain);
  out.set_space_id(space->id);
  out.set_block_bytes(space->block_bytes);
  out.set_block_slots(space->slots);
  out.set_table_bytes(space->table_bytes);
  out.set_daemon_epoch(daemon_epoch_);
  out.set_ticket(ticket.ticket);
  for (int64_t s : ticket.slots) out.add_slots(s);
  const blocks::BlockSpaceStats st = space->index->stats();
  out.set_published(st.published);
  out.set_pending(st.pending);
  out.set_leased(st.leased);
  out.set_evictions(st.evictions);
  out.set_stores_no_room(st.stores_no_room);
  out.set_owners_dropped(st.owners_dropped);
  ReportLocked();
  return reply;
}

int BlockIndex::ReapLocked() {
  int dropped = 0;
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (!it->second->Exited()) {
      ++it;
      continue;
    }
    for (auto& [key, space] : spaces_) space->index->DropOwner(it->first);
    owners_.erase(it++);
    ++dropped;
  }
  if (dropped > 0 && metrics_ != nullptr) {
    metrics_->CountOwnersReaped(dropped);
    ReportLocked();
  }
  return dropped;
}

void BlockIndex::ReportLocked() {
  if (metrics_ == nullptr) return;
  using Domain = BlockMetrics::Domain;
  std::array<uint64_t, BlockMetrics::kDomains> held{}, capacity{}, leases{};
  for (auto& [key, space] : spaces_) {
    const Domain domain = space->domain == kSharedDomain ? Domain::kShared : Domain::kPrivate;
    const blocks::BlockSpaceStats now = space->index->stats();
    metrics_->CountMoved(domain, space->reported, now);
    space->reported = now;
    const int d = static_cast<int>(domain);
    held[d] += now.published * space->block_bytes;
    capacity[d] += space->slots * space->block_bytes;
    leases[d] += now.leases;
  }
  for (int d = 0; d < BlockMetrics::kDomains; ++d) {
    metrics_->SetHeld(static_cast<Domain>(d), held[d], capacity[d], leases[d]);
  }
}

int BlockIndex::ReapExited() {
  absl::MutexLock lock(&mu_);
  return ReapLocked();
}

}  // namespace kvtier::daemon
