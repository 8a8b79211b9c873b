#ifndef KVTIER_WORKER_HOST_KV_BACKEND_H_
#define KVTIER_WORKER_HOST_KV_BACKEND_H_

// The host backend of the tiered store: T0 blocks are host memory, every copy is a memcpy that
// has landed when the call returns (tokens are always kNoCopyPending), T1 pages are attended in
// place by the CPU kernel in position order (zero-error), T2 pages are dequantized into a
// staging cache one (page, layer) block at a time and kept while their version holds
// (differential staging), and pages a schedule leaves in place are attended as a second
// partial merged by log-sum-exp (split attention).

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kv_backend.h"

namespace kvtier::worker {

struct HostKvBackendOptions {
  KvLayout layout;
  uint32_t num_q_heads = 0;
  float scale = 0.f;              // > 0
  uint32_t max_staged_pages = 0;  // dequantized T2 pages kept; 0 = no limit
  bool portable_kernel = false;
};

// Not thread-safe (one store's decode loop).
class HostKvBackend final : public KvBackend {
 public:
  explicit HostKvBackend(const HostKvBackendOptions& options);

  bool host_t0() const override { return true; }
  absl::Status ClearBlock(uint8_t* block, uint64_t bytes) override;
  absl::Status WriteRows(uint8_t* k_dst, uint8_t* v_dst, const float* k, const float* v,
                         uint32_t rows, uint64_t row_floats) override;
  absl::Status WriteStridedRows(uint8_t* k_dst, uint8_t* v_dst, const float* k,
                                RowStrides k_strides, const float* v, RowStrides v_strides,
                                uint32_t rows, uint32_t heads, uint32_t head_dim) override;
  absl::Status CopyPage(tiering::Tier from, const uint8_t* src, tiering::Tier to, uint8_t* dst,
                        uint64_t bytes) override;
  absl::Status EncodePage(tiering::Tier from, const uint8_t* src, uint32_t group, uint32_t rows,
                          uint8_t* dst) override;
  absl::Status DecodePage(const uint8_t* src, uint32_t group, uint32_t rows, tiering::Tier to,
                          uint8_t* dst) override;
  absl::Status ReadPage(const StoredPage& page, uint32_t group, const uint8_t* ddr_base,
                        const uint8_t* compressed_base, float* dst) override;
  CopyToken LastToken() override { return kNoCopyPending; }
  bool Completed(CopyToken) override { return true; }
  absl::Status Wait(CopyToken) override { return absl::OkStatus(); }
  void Forget(uint32_t group, uint32_t page) override;
  absl::Status Attend(const AttendCall& call, StoreStats& stats) override;
  void SetTaskRunner(kernels::TaskRunner* runner) override { runner_ = runner; }

 private:
  struct Staged {
    uint64_t version = 0;
    uint64_t last_use = 0;
    std::vector<float> data;           // the page, full precision
    std::vector<uint8_t> layer_ready;  // per layer of the group
  };

  void DecodeLayer(uint32_t group, uint32_t layer_in_group, const uint8_t* src, uint32_t rows,
                   float* dst) const;
  const float* StagedLayer(const AttendCall& call, uint32_t page, StoreStats& stats);
  void TrimStaging();
  // Attention as two partials (pages in place, the rest) merged by log-sum-exp; `p` is the
  // unsplit call, its rows in k_rows_/v_rows_.
  void AttendSplit(const kernels::AttentionParams& p, const AttendCall& call);

  KvLayout layout_;
  uint32_t num_q_heads_;
  float scale_;
  uint32_t max_staged_pages_;
  kernels::Isa isa_;
  kernels::TaskRunner* runner_ = nullptr;         // not owned
  absl::flat_hash_map<uint64_t, Staged> staged_;  // key: group << 32 | page
  uint64_t use_clock_ = 0;
  // Per-Attend buffers, kept to avoid reallocation.
  std::vector<const float*> k_rows_, v_rows_;
  std::vector<float> scratch_;
  std::vector<const float*> split_k_[2], split_v_[2];
  std::vector<float> part_out_[2], part_lse_[2], part_mass_[2];
};

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_HOST_KV_BACKEND_H_
