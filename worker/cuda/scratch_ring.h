#ifndef KVTIER_WORKER_CUDA_SCRATCH_RING_H_
#define KVTIER_WORKER_CUDA_SCRATCH_RING_H_

// A scratch area of `capacity` entries reused by batches in flight on a stream (the T2 codes and
// pointer arrays of compressed offloads and restores): each batch takes n consecutive entries in
// ring order, wrapping to 0 when they would pass the end, so a batch waits only for the earlier
// batches whose entries it reuses — not, as one shared area would make it, for the batch just
// before it (a host wait per page). Pure host logic: the caller keeps one event per batch.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace kvtier::worker::cuda {

class ScratchRing {
 public:
  explicit ScratchRing(uint32_t capacity) : capacity_(capacity) {}

  struct Reservation {
    uint32_t first = 0;
    std::vector<uint64_t> reused;  // ids of earlier batches that must complete first
  };
  // Entries [first, first + n) for batch `id`; the batches returned in `reused` are forgotten.
  // REQUIRES: 0 < n <= capacity.
  Reservation Reserve(uint32_t n, uint64_t id) {
    if (next_ + n > capacity_) next_ = 0;
    Reservation r{next_, {}};
    for (auto it = uses_.begin(); it != uses_.end();) {
      if (it->first < next_ + n && next_ < it->first + it->n) {
        r.reused.push_back(it->id);
        it = uses_.erase(it);
      } else {
        ++it;
      }
    }
    uses_.push_back({next_, n, id});
    next_ += n;
    return r;
  }
  // Batch `id` is known complete: no later batch waits for it.
  void Completed(uint64_t id) {
    for (auto it = uses_.begin(); it != uses_.end(); ++it) {
      if (it->id == id) {
        uses_.erase(it);
        return;
      }
    }
  }
  size_t in_flight() const { return uses_.size(); }
  uint32_t capacity() const { return capacity_; }

 private:
  struct Use {
    uint32_t first, n;
    uint64_t id;
  };
  const uint32_t capacity_;
  uint32_t next_ = 0;
  std::deque<Use> uses_;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_SCRATCH_RING_H_
