// Pool memory of ended sessions: an extent goes back to the budget only once no process holds
// it, because a process keeps memory it has open or mapped whatever the daemon's books say. The
// kernel says so for memfd and tmpfs extents (each worker gets an open of its own, and a write
// lease is granted only while the daemon's is the last one: forks and descriptors passed on
// count too); for CUDA VMM extents the daemon watches the processes that received them (a
// pidfd each) and waits for all of them to exit. Until then an extent drains: charged, reported
// (GetStatus, kvtier_pool_draining_bytes) and never handed to anyone again. So a mass lease loss
// cannot double the pools' real footprint: workers that register again while their old pages
// are still mapped find the budget as short as the memory really is (degraded plans, as for any
// full pool), never over-committed; the old extents come back as the workers let go of them.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/daemon_core_impl.h"

namespace kvtier::daemon::internal {
namespace {

// Processes one worker's extents may be handed to (a worker and the helpers it forks to map).
constexpr size_t kMaxHolders = 16;
// Revoked sessions remembered for their PERMISSION_DENIED answer.
constexpr size_t kMaxRevoked = 4096;

bool Exited(const std::shared_ptr<const edge::PeerProcess>& p) { return p->Exited(); }

}  // namespace

absl::Status DaemonCoreImpl::AddHolderLocked(WorkerRec& w, const edge::PeerCredentials& peer,
                                             bool required) {
  std::shared_ptr<const edge::PeerProcess> process = peer.process;
  if (process == nullptr) {
    // A caller of the core without a socket (tests): the pid is in our namespace.
    absl::StatusOr<std::shared_ptr<const edge::PeerProcess>> by_pid =
        edge::PeerProcess::OfPid(peer.pid);
    if (!by_pid.ok()) {
      if (!required) return absl::OkStatus();  // the kernel watches these extents for us
      // Refused rather than charged for ever: memory nobody can watch would never come back.
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA VMM extents are handed only to a process the daemon can watch, and the kernel "
          "named none for uid ",
          peer.uid, " pid ", peer.pid, " (", by_pid.status().message(),
          "; SO_PEERPIDFD needs Linux 6.5+)"));
    }
    process = *std::move(by_pid);
  }
  for (const auto& held : w.holders) {
    if (held == process || (process->id() != 0 && held->id() == process->id())) {
      return absl::OkStatus();
    }
  }
  std::erase_if(w.holders, Exited);
  if (w.holders.size() >= kMaxHolders) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_id ", w.id, "'s extents were handed to ", w.holders.size(),
                     " live processes already (at most ", kMaxHolders, ")"));
  }
  w.holders.push_back(std::move(process));
  return absl::OkStatus();
}

bool DaemonCoreImpl::ExtentHeldLocked(
    const Extent& e, const std::vector<std::shared_ptr<const edge::PeerProcess>>& holders) const {
  switch (e.OthersHold()) {
    case Extent::Holders::kNone:
      return false;
    case Extent::Holders::kSome:
      return true;
    case Extent::Holders::kUnknown:
      break;
  }
  return !holders.empty();
}

void DaemonCoreImpl::RetireMemoryLocked(WorkerRec& w) {
  DrainingMemory d;
  d.worker_id = w.id;
  d.uid = w.peer.uid;
  std::erase_if(w.holders, Exited);
  bool any = false;
  for (int i = 0; i < 2; ++i) {
    if (w.memory[i] == nullptr) continue;
    for (Extent& e : w.memory[i]->TakeExtents()) {
      if (!ExtentHeldLocked(e, w.holders)) {  // nobody can map it: back to the budget now
        pools_[i]->Return(e.bytes());
        continue;
      }
      draining_bytes_[i] += e.bytes();
      d.extents[i].push_back(std::move(e));
      any = true;
    }
  }
  if (!any) return;
  d.holders = std::move(w.holders);
  draining_.push_back(std::move(d));
}

int DaemonCoreImpl::ReleaseDrainedLocked() {
  int released = 0;
  std::erase_if(draining_, [&](DrainingMemory& d) {
    std::erase_if(d.holders, Exited);
    for (int i = 0; i < 2; ++i) {
      std::erase_if(d.extents[i], [&](const Extent& e) {
        if (ExtentHeldLocked(e, d.holders)) return false;
        draining_bytes_[i] -= e.bytes();
        pools_[i]->Return(e.bytes());
        ++released;
        return true;
      });
    }
    return d.extents[0].empty() && d.extents[1].empty();
  });
  if (released > 0) UpdateGaugesLocked();
  return released;
}

void DaemonCoreImpl::RevokeDisallowedLocked(std::vector<std::string>* revoked) {
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& [id, w] : workers_) {
    absl::Status allowed = AllowedLocked(options_.security, w.peer);
    if (allowed.ok()) continue;
    out.emplace_back(id, absl::StrCat("worker_id ", id,
                                      ": session revoked by a [security] "
                                      "reload: ",
                                      allowed.message()));
  }
  absl::erase_if(tickets_, [&](const auto& kv) {
    return !AllowedLocked(options_.security, kv.second.peer).ok();
  });
  for (auto& [id, why] : out) {
    FreeWorkerLocked(id);
    {
      PiMutexLock lease_lock(&lease_mu_);
      while (revoked_.size() >= kMaxRevoked) revoked_.erase(revoked_.begin());
      revoked_[id] = why;
    }
    if (revoked != nullptr) revoked->push_back(std::move(why));
  }
  if (!out.empty()) UpdateGaugesLocked();
}

}  // namespace kvtier::daemon::internal
