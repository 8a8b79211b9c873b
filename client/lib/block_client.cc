#include "kvtier/block_client.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/blocks/block_table.h"
#include "core/status/status_macros.h"
#include "edge/daemon_identity.h"
#include "edge/memory_channel.h"

namespace kvtier {
namespace {

constexpr int kKeysPerRequest = 1024;  // the daemon's bound per request (one datagram)

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept : base_(o.base_), bytes_(o.bytes_) { o.base_ = nullptr; }
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Unmap();
      base_ = o.base_;
      bytes_ = o.bytes_;
      o.base_ = nullptr;
    }
    return *this;
  }
  ~Mapping() { Unmap(); }
  void Unmap() {
    if (base_ != nullptr) munmap(base_, bytes_);
    base_ = nullptr;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(base_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
};

absl::StatusOr<Mapping> Map(int fd, uint64_t bytes, bool writable, const char* what) {
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon's ", what, " is smaller than the ", bytes, " bytes it said"));
  }
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap(", what, "): ", std::strerror(errno)));
  }
  return Mapping(p, bytes);
}

class BlockClientImpl final : public BlockClient {
 public:
  BlockClientImpl(BlockClientOptions options, std::string channel, edge::DaemonUids daemon)
      : options_(std::move(options)), channel_(std::move(channel)), daemon_(std::move(daemon)) {}

  absl::Status Connect() {
    v1::ChannelRequest request;
    v1::BlockOpen& open = *request.mutable_block_open();
    open.set_space(options_.space);
    open.set_block_bytes(options_.block_bytes);
    open.set_key_bytes(options_.key_bytes);
    open.set_want_bytes(options_.want_bytes);
    std::vector<edge::UniqueFd> fds;
    ASSIGN_OR_RETURN(v1::BlockReply reply, Call(request, &fds));
    if (fds.size() != 2) {
      return absl::FailedPreconditionError(
          absl::StrCat("BlockOpen's reply carried ", fds.size(), " descriptors; expected 2"));
    }
    ASSIGN_OR_RETURN(table_, Map(fds[0].get(), reply.table_bytes(), false, "block table"));
    reader_ = blocks::BlockTableReader(table_.data(), table_.bytes());
    if (!reader_.valid() || reader_.header()->block_bytes != options_.block_bytes ||
        reader_.header()->key_bytes != options_.key_bytes ||
        reader_.header()->block_slots != reply.block_slots()) {
      return absl::FailedPreconditionError("the daemon's block table does not match its reply");
    }
    slots_ = reply.block_slots();
    ASSIGN_OR_RETURN(arena_, Map(fds[1].get(), slots_ * options_.block_bytes, true, "block arena"));
    return absl::OkStatus();
  }

  bool Lookup(std::string_view key) const override {
    blocks::BlockTableHit hit;
    return reader_.Find(key, &hit);
  }

  absl::StatusOr<BlockGrant> BeginStore(absl::Span<const std::string> keys) override {
    return Batch(keys, /*store=*/true);
  }

  absl::Status FinishStore(uint64_t ticket, bool ok) override {
    v1::ChannelRequest request;
    request.mutable_block_finish()->set_space(options_.space);
    request.mutable_block_finish()->set_ticket(ticket);
    request.mutable_block_finish()->set_ok(ok);
    return Call(request, nullptr).status();
  }

  absl::StatusOr<BlockGrant> Acquire(absl::Span<const std::string> keys) override {
    return Batch(keys, /*store=*/false);
  }

  absl::Status Release(uint64_t ticket) override {
    v1::ChannelRequest request;
    request.mutable_block_release()->set_space(options_.space);
    request.mutable_block_release()->set_ticket(ticket);
    return Call(request, nullptr).status();
  }

  uint8_t* block(int64_t slot) const override {
    if (slot < 0 || static_cast<uint64_t>(slot) >= slots_) return nullptr;
    return arena_.data() + static_cast<uint64_t>(slot) * options_.block_bytes;
  }
  uint64_t block_bytes() const override { return options_.block_bytes; }
  uint32_t key_bytes() const override { return options_.key_bytes; }
  BlockStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // One request (more than the daemon's bound per request is refused here, not split: a grant is
  // one ticket).
  absl::StatusOr<BlockGrant> Batch(absl::Span<const std::string> keys, bool store) {
    if (keys.size() > static_cast<size_t>(kKeysPerRequest)) {
      return absl::InvalidArgumentError(
          absl::StrCat(keys.size(), " keys in one call; at most ", kKeysPerRequest));
    }
    v1::ChannelRequest request;
    auto* list = store ? request.mutable_block_store()->mutable_keys()
                       : request.mutable_block_acquire()->mutable_keys();
    if (store) {
      request.mutable_block_store()->set_space(options_.space);
    } else {
      request.mutable_block_acquire()->set_space(options_.space);
    }
    for (const std::string& k : keys) list->Add(std::string(k));
    ASSIGN_OR_RETURN(v1::BlockReply reply, Call(request, nullptr));
    if (reply.slots_size() != static_cast<int>(keys.size())) {
      return absl::InternalError(absl::StrCat("the daemon answered ", reply.slots_size(),
                                              " slots for ", keys.size(), " keys"));
    }
    BlockGrant out{reply.ticket(), {reply.slots().begin(), reply.slots().end()}};
    for (int64_t s : out.slots) {
      if (s >= static_cast<int64_t>(slots_)) {
        return absl::InternalError(absl::StrCat("the daemon granted slot ", s, " of ", slots_));
      }
    }
    return out;
  }

  absl::StatusOr<v1::BlockReply> Call(const v1::ChannelRequest& request,
                                      std::vector<edge::UniqueFd>* fds) {
    ASSIGN_OR_RETURN(v1::ChannelReply reply,
                     edge::ChannelCall(channel_, request, fds, options_.timeout, &daemon_));
    const v1::BlockReply& b = reply.block();
    absl::MutexLock lock(&mu_);
    stats_ = {b.domain(),  b.space_id(), b.block_slots(), b.daemon_epoch(),   b.published(),
              b.pending(), b.leased(),   b.evictions(),   b.stores_no_room(), b.owners_dropped()};
    return b;
  }

  const BlockClientOptions options_;
  const std::string channel_;
  const edge::DaemonUids daemon_;
  Mapping table_, arena_;
  blocks::BlockTableReader reader_;
  uint64_t slots_ = 0;
  mutable absl::Mutex mu_;
  BlockStats stats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockClient>> BlockClient::Open(const BlockClientOptions& options) {
  if (options.key_bytes == 0 || options.key_bytes > blocks::kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key_bytes = ", options.key_bytes, "; must be 1..", blocks::kMaxKeyBytes));
  }
  if (options.block_bytes == 0) {
    return absl::InvalidArgumentError("block_bytes = 0; a block holds at least one byte");
  }
  ASSIGN_OR_RETURN(std::string socket_path, edge::UnixSocketPath(options.address));
  ASSIGN_OR_RETURN(edge::DaemonUids daemon, edge::ResolveDaemonUids(options.daemon_uid));
  auto client = std::make_unique<BlockClientImpl>(options, edge::ChannelPathFor(socket_path),
                                                  std::move(daemon));
  RETURN_IF_ERROR(client->Connect());
  return std::unique_ptr<BlockClient>(std::move(client));
}

}  // namespace kvtier
