#ifndef KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_
#define KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_

// Prefill of several identical caches at once (the prefill computed once per prompt and its
// state forked per configuration): K/V go to all of them; the first one attends and its output
// feeds the model. A baseline's probe (HeadProbeCache) keeps the queries and skips its store's
// attention (the store keeps nothing from it; the probe computes the baseline's scores). A
// runtime sequence (hierarchy), when the first member is one too, takes the first's position
// mass for its scores (TieredSequence::AttendShared: every page is in T0 during the prefill, so
// its own kernel would compute the same). With `verify` every member attends for itself and its
// output is checked bit for bit against the first's.

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"
#include "engine/eval/head_probe.h"
#include "worker/attention_cache.h"
#include "worker/runtime/tiered_sequence.h"

namespace kvtier::engine {

class FanOutCache final : public worker::AttentionCache {
 public:
  explicit FanOutCache(std::vector<worker::AttentionCache*> caches, bool verify = false)
      : caches_(std::move(caches)), verify_(verify) {}
  uint32_t Length(uint32_t layer) const override { return caches_[0]->Length(layer); }
  absl::Status Append(uint32_t layer, const float* k, const float* v, uint32_t n) override {
    for (worker::AttentionCache* c : caches_) RETURN_IF_ERROR(c->Append(layer, k, v, n));
    return absl::OkStatus();
  }
  absl::Status Attend(uint32_t layer, const float* q, uint32_t n, float* out,
                      float* position_mass) override {
    // The first member's mass, for runtime members to share (its own when the caller has none).
    const bool first_is_runtime = dynamic_cast<worker::TieredSequence*>(caches_[0]) != nullptr;
    float* mass = position_mass;
    if (mass == nullptr && first_is_runtime && !verify_) {
      mass_.resize(caches_[0]->Length(layer));
      mass = mass_.data();
    }
    RETURN_IF_ERROR(caches_[0]->Attend(layer, q, n, out, mass));
    for (size_t i = 1; i < caches_.size(); ++i) {
      if (auto* probe = dynamic_cast<HeadProbeCache*>(caches_[i]); probe != nullptr && !verify_) {
        probe->AttendShared(layer, q, n);
        ++shared_;
        continue;
      }
      if (auto* seq = dynamic_cast<worker::TieredSequence*>(caches_[i]);
          seq != nullptr && first_is_runtime && !verify_) {
        RETURN_IF_ERROR(seq->AttendShared(layer, n, mass));
        ++shared_;
        continue;
      }
      scratch_.assign(out_floats_, 0.f);
      RETURN_IF_ERROR(caches_[i]->Attend(layer, q, n, scratch_.data(), nullptr));
      if (!std::equal(scratch_.begin(), scratch_.end(), out)) {
        return absl::InternalError(absl::StrFormat(
            "prefill: member %d attends differently from the full cache in layer %d", i, layer));
      }
    }
    return absl::OkStatus();
  }
  void SetTaskRunner(worker::kernels::TaskRunner* runner) override {
    for (worker::AttentionCache* c : caches_) c->SetTaskRunner(runner);
  }
  // Floats of one Attend output (tokens × q heads × head_dim).
  void set_out_floats(size_t n) { out_floats_ = n; }
  // (member, layer) attentions taken from the first member instead of computed.
  uint64_t shared() const { return shared_; }

 private:
  std::vector<worker::AttentionCache*> caches_;
  bool verify_;
  std::vector<float> scratch_, mass_;
  size_t out_floats_ = 0;
  uint64_t shared_ = 0;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_FAN_OUT_CACHE_H_
