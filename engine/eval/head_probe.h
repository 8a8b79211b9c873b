#ifndef KVTIER_ENGINE_EVAL_HEAD_PROBE_H_
#define KVTIER_ENGINE_EVAL_HEAD_PROBE_H_

// Per-head attention for the worker-side baselines (h2o, rkv, arkv) without changing the
// AttentionCache interface or the store's kernel: a decorator that forwards every call to the
// real cache (whose output the model uses) and keeps what it needs to recompute, on request,
// the softmax rows of the most recent queries per query head — a copy of the post-RoPE keys,
// the last queries, and its own view of which (layer, kv head, position) is masked.
// Not thread-safe: one decode loop drives it.
//
// Probes fed by one fan-out prefill (FanOutCache) hold identical state until their first own
// Attend or Drop; while they do, rows one of them computed are taken from a SharedProbeRows
// instead of being recomputed (the baselines at every β score the same prefill).

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "worker/attention_cache.h"
#include "worker/kernels/task_runner.h"

namespace kvtier::engine {

// Rows computed from a fan-out prefill's state, for the probes that still hold it. One per
// prefill (an evaluation item); not thread-safe.
struct SharedProbeRows {
  uint32_t rows_length = 0, rows = 0;  // ComputeRows(rows) at length rows_length
  std::vector<float> rows_data;
  uint32_t sums_length = 0, sums_queries = 0;  // ColumnSums over sums_queries at sums_length
  std::vector<float> sums_data;
};

class HeadProbeCache final : public worker::AttentionCache {
 public:
  // `inner` is not owned and must outlive the probe. Keeps up to `query_capacity` most recent
  // queries per layer.
  HeadProbeCache(const worker::AttentionShape& shape, worker::AttentionCache* inner,
                 uint32_t query_capacity);

  uint32_t Length(uint32_t layer) const override { return inner_->Length(layer); }
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override;
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override;
  // The real cache attends with the model's threads; the probe keeps the last runner given (the
  // model's pool, which outlives an evaluation item's probes) to compute rows over the layers.
  void SetTaskRunner(worker::kernels::TaskRunner* runner) override {
    inner_->SetTaskRunner(runner);
    if (runner != nullptr) runner_ = runner;
  }
  // A forked prefill (FanOutCache): keeps the queries as Attend does, without attending. Only
  // for an inner cache that keeps nothing from an Attend (the baselines' TieredKvStore on the
  // host, whose scores are the probe's), holding the same K/V, every position live, as the
  // cache whose result this attention shares.
  void AttendShared(uint32_t layer, const float* q, uint32_t n) { KeepQueries(layer, q, n); }

  void set_query_capacity(uint32_t capacity);
  // Rows shared with the other probes of the same fan-out prefill (not owned; may be null).
  void set_shared_rows(SharedProbeRows* shared) { shared_ = shared; }
  // Marks (layer, kv_head, position) as no longer attended (mirrors the real cache's mask).
  void Drop(uint32_t layer, uint32_t kv_head, uint32_t position);
  bool Dropped(uint32_t layer, uint32_t kv_head, uint32_t position) const;

  // Softmax rows of the last `rows` queries (rows <= stored queries), causal, over the kept
  // positions of the current length L: out = [num_layers][num_q_heads][rows][L] (0 where
  // masked or in the future of the query).
  void ComputeRows(uint32_t rows, std::vector<float>& out) const;
  // Column sums of the softmax rows of every stored query: [num_layers][num_q_heads][L]
  // (ComputeRows summed over rows, without holding the rows).
  void ColumnSums(std::vector<float>& out) const;
  // Keys as [num_layers][num_kv_heads][L][head_dim].
  void KeysByHead(std::vector<float>& out) const;
  uint32_t stored_queries() const;
  const worker::AttentionShape& shape() const { return shape_; }

 private:
  void KeepQueries(uint32_t layer, const float* q, uint32_t n);
  // Softmax row of stored query `query` of `layer`, head `head`, into dst[0, L) (dst's masked
  // and future entries are left as they are).
  void Row(uint32_t layer, size_t query, uint32_t head, float* dst,
           std::vector<float>& logits) const;
  // f(layer) for every layer, on the runner's threads when there is one (layers are independent).
  void ForEachLayer(const std::function<void(uint32_t)>& f) const;
  // Whether this probe still holds only the fan-out prefill's state (rows may be shared).
  bool Shares() const { return shared_ != nullptr && pristine_; }

  worker::AttentionShape shape_;
  worker::AttentionCache* inner_;
  uint32_t query_capacity_;
  // Keys per (layer, kv head) in blocks of kLanes positions, [block][head_dim][kLanes], so one
  // query's logits over kLanes positions are computed at once (each lane sums over head_dim in
  // order, as a scalar dot product would: the same floats).
  static constexpr uint32_t kLanes = 8;
  std::vector<std::vector<float>> key_blocks_;           // [layer * kv + h]
  std::vector<std::vector<uint8_t>> dropped_;            // [layer * kv + h][position]
  std::vector<std::deque<std::vector<float>>> queries_;  // [layer] oldest first, with position
  std::vector<std::deque<uint32_t>> query_pos_;
  SharedProbeRows* shared_ = nullptr;
  worker::kernels::TaskRunner* runner_ = nullptr;
  bool pristine_ = true;  // no own Attend, no Drop yet
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_HEAD_PROBE_H_
