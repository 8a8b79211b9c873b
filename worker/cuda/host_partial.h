#ifndef KVTIER_WORKER_CUDA_HOST_PARTIAL_H_
#define KVTIER_WORKER_CUDA_HOST_PARTIAL_H_

// The CPU's half of split attention on a GPU worker: one decode query's attention over the pages
// a schedule leaves in place, read from pool memory where they live (f32 T1 rows in place, a
// bf16 T1 layer block widened, T2 decoded by the CPU codec once per page version), by the
// worker's span kernel with its log-sum-exp and per-head weights, which MergeSplitAttention
// merges on the device with the GPU's partial over every other page. No CUDA call.

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "worker/host_kv_backend.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kv_backend.h"

namespace kvtier::worker::cuda {

// Where the partial goes (host memory): out [num_q_heads][head_dim], lse [num_q_heads],
// head_mass [num_q_heads][length].
struct HostPartialOut {
  float* out = nullptr;
  float* lse = nullptr;
  float* head_mass = nullptr;
};

// Not thread-safe (one store's decode loop).
class HostPartial {
 public:
  // `layout`: the store's (element_bytes 4 or 2).
  HostPartial(const KvLayout& layout, uint32_t num_q_heads, float scale);

  // The partial of `call` (one query, q in host memory) over the pages p with in_place[p] != 0,
  // each in T1 or T2; every other position is left out (zero weight, as an evicted one).
  absl::Status Run(const AttendCall& call, const float* q, const std::vector<uint8_t>& in_place,
                   const HostPartialOut& out);
  // Drops decoded T2 pages (a new schedule).
  void Forget() { decoded_.clear(); }

 private:
  struct Decoded {
    uint64_t version = 0;
    std::vector<float> values;  // the whole page, f32
  };
  // f32 rows of layer `l` of the page (K block then V block), or an error.
  absl::Status LayerRows(const AttendCall& call, uint32_t page, const float** block);

  KvLayout layout_;
  uint32_t num_q_heads_;
  float scale_;
  kernels::Isa isa_;
  HostKvBackend codec_;  // f32 layout: decodes T2 pages with the CPU codec
  absl::flat_hash_map<uint64_t, Decoded> decoded_;  // key: group << 32 | page
  std::vector<std::vector<float>> widened_;         // per in-place page of a call (bf16 T1)
  std::vector<const float*> k_rows_, v_rows_;
  std::vector<float> scratch_;
};

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_HOST_PARTIAL_H_
