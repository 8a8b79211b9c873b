#ifndef KVTIER_WORKER_CUDA_PIN_LEDGER_H_
#define KVTIER_WORKER_CUDA_PIN_LEDGER_H_

// Which parts of a host pool are registered for DMA, and the rules for registering more, with
// the registration itself (cudaHostRegister / cudaHostUnregister) injected: pure host logic.
// A daemon pool is a reserved range into which extents are mapped one by one
// (client/lib/extent_mapping.h); the rest of the range is PROT_NONE, which the driver refuses to
// pin. So a registration unit never crosses an extent, and only units inside the mapped extents
// are registered: a range beyond them is FAILED_PRECONDITION, and nothing is asked of the
// driver. A local pool is one extent, all mapped.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::worker::cuda {

// The registration unit of a pool of `size` bytes made of extents of `extent_bytes`: at most
// `chunk_bytes` and, when the pool has several extents, a divisor of the extent (a multiple of
// 4096), so units tile every extent and a copy cut at unit multiples never spans two
// registrations. INVALID_ARGUMENT naming the field for a zero or unaligned size, chunk or extent,
// or an extent that does not divide the size.
absl::StatusOr<uint64_t> PinUnitBytes(uint64_t size, uint64_t extent_bytes, uint64_t chunk_bytes);

struct PinHooks {
  // Registers [offset, offset + bytes) of the pool; an error is returned to the caller as is.
  std::function<absl::Status(uint64_t offset, uint64_t bytes)> pin;
  // Unregisters what pin(offset, ...) registered.
  std::function<void(uint64_t offset)> unpin;
  // Bytes mapped from offset 0 (whole extents); null: the whole pool.
  std::function<uint64_t()> mapped_bytes;
};

// Thread-safe. Unpins everything it pinned on destruction (or ReleaseAll).
class PinLedger {
 public:
  // `borrowed`: pinned by someone else (the daemon's CUDA VMM memory): nothing is registered
  // and every unit counts as pinned.
  static absl::StatusOr<std::unique_ptr<PinLedger>> Create(uint64_t size, uint64_t extent_bytes,
                                                           uint64_t chunk_bytes, PinHooks hooks,
                                                           bool borrowed);
  ~PinLedger() { ReleaseAll(); }
  PinLedger(const PinLedger&) = delete;
  PinLedger& operator=(const PinLedger&) = delete;

  // Registers every unit [offset, offset + bytes) touches that is not registered yet.
  // OUT_OF_RANGE when the range leaves the pool; FAILED_PRECONDITION (naming the mapped extents)
  // when it reaches past the mapped extents.
  absl::Status EnsurePinned(uint64_t offset, uint64_t bytes);
  bool IsPinned(uint64_t offset, uint64_t bytes) const;
  void ReleaseAll();

  uint64_t size() const { return size_; }
  uint64_t unit_bytes() const { return unit_; }
  uint64_t pinned_bytes() const;

 private:
  PinLedger(uint64_t size, uint64_t extent, uint64_t unit, PinHooks hooks, bool borrowed)
      : size_(size),
        extent_(extent),
        unit_(unit),
        hooks_(std::move(hooks)),
        borrowed_(borrowed),
        pinned_((size + unit - 1) / unit, borrowed) {}
  uint64_t UnitBytes(uint64_t i) const { return std::min(unit_, size_ - i * unit_); }

  const uint64_t size_, extent_, unit_;
  const PinHooks hooks_;
  const bool borrowed_;
  mutable absl::Mutex mu_;
  std::vector<bool> pinned_ ABSL_GUARDED_BY(mu_);
};

// Pin records of a worker, one per pool memory, shared by every store over it (registering a
// range twice fails). A record is keyed by the identity of the memory (the object that owns the
// mapping), never by address alone, and holds that owner: the mapping stays mapped while
// registered, and the record leaves the registry (under its lock) before it unpins, so a new
// mapping at a reused address never finds an old record. Thread-safe.
template <typename Record>
class PinRegistry {
 public:
  PinRegistry() : state_(std::make_shared<State>()) {}

  // The live record for `key`, or a new one from `make` (nothing kept when it fails).
  absl::StatusOr<std::shared_ptr<Record>> For(
      const void* key, const std::function<absl::StatusOr<std::unique_ptr<Record>>()>& make) {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->live.find(key);
    if (it != state_->live.end()) {
      if (std::shared_ptr<Record> r = it->second.lock()) return r;
    }
    absl::StatusOr<std::unique_ptr<Record>> made = make();
    if (!made.ok()) return made.status();
    std::shared_ptr<Record> r(made->release(), [state = state_, key](Record* dead) {
      absl::MutexLock lock(&state->mu);
      auto found = state->live.find(key);
      if (found != state->live.end() && found->second.expired()) state->live.erase(found);
      delete dead;  // unpins under the lock: no new record for this key meanwhile
    });
    state_->live[key] = r;
    return r;
  }
  size_t live() const {
    absl::MutexLock lock(&state_->mu);
    size_t n = 0;
    for (const auto& [key, weak] : state_->live) n += !weak.expired();
    return n;
  }

 private:
  struct State {
    mutable absl::Mutex mu;
    std::map<const void*, std::weak_ptr<Record>> live ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_PIN_LEDGER_H_
