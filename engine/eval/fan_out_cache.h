#ifndef KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_
#define KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_

// Prefill of several identical caches at once (the prefill computed once per prompt and its
// state forked per configuration): K/V go to all of them, every one attends (so each scores and
// probes as it would alone, and its output is checked bit for bit against the first's), the
// first one's output feeds the model.

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"
#include "worker/attention_cache.h"

namespace kvtier::engine {

class FanOutCache final : public worker::AttentionCache {
 public:
  explicit FanOutCache(std::vector<worker::AttentionCache*> caches) : caches_(std::move(caches)) {}
  uint32_t Length(uint32_t layer) const override { return caches_[0]->Length(layer); }
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override {
    for (worker::AttentionCache* c : caches_) RETURN_IF_ERROR(c->Append(layer, k, v, n));
    return absl::OkStatus();
  }
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override {
    RETURN_IF_ERROR(caches_[0]->Attend(layer, q, n, out, position_mass));
    for (size_t i = 1; i < caches_.size(); ++i) {
      scratch_.assign(out_floats_, 0.f);
      RETURN_IF_ERROR(caches_[i]->Attend(layer, q, n, scratch_.data(), nullptr));
      if (!std::equal(scratch_.begin(), scratch_.end(), out)) {
        return absl::InternalError(absl::StrFormat(
            "prefill: member %d attends differently from the full cache in layer %d", i, layer));
      }
    }
    return absl::OkStatus();
  }
  // Floats of one Attend output (tokens × q heads × head_dim).
  void set_out_floats(size_t n) { out_floats_ = n; }

 private:
  std::vector<worker::AttentionCache*> caches_;
  std::vector<float> scratch_;
  size_t out_floats_ = 0;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_
