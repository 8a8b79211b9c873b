#include "tests/support/synthetic_engine.h"

#include "core/status/status_macros.h"

namespace kvtier::testing {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

void SyntheticEngine::Fill(uint32_t layer, uint64_t position, uint32_t which, uint32_t count,
                           float* out) const {
  uint64_t base =
      Mix(seed_ ^ Mix(layer * 0x100000001b3ull + position * 0x9e3779b97f4a7c15ull + which));
  const float loud = (Mix(base) % 7 == 0) ? 3.f : 1.f;  // some keys stand out
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t r = Mix(base + i);
    out[i] = loud * (static_cast<float>(r >> 40) / static_cast<float>(1ull << 23) - 1.f);
  }
}

absl::Status SyntheticEngine::Forward(worker::AttentionCache& cache, uint32_t n,
                                      std::vector<float>* outputs) {
  const uint32_t kv = shape_.num_kv_heads * shape_.head_dim;
  const uint32_t qd = shape_.num_q_heads * shape_.head_dim;
  std::vector<float> k(n * kv), v(n * kv), q(n * qd), out(n * qd);
  for (uint32_t layer = 0; layer < shape_.num_layers; ++layer) {
    const uint64_t start = cache.Length(layer);
    for (uint32_t t = 0; t < n; ++t) {
      Fill(layer, start + t, 0, kv, &k[t * kv]);
      Fill(layer, start + t, 1, kv, &v[t * kv]);
      Fill(layer, start + t, 2, qd, &q[t * qd]);
    }
    RETURN_IF_ERROR(cache.Append(layer, k.data(), v.data(), n));
    RETURN_IF_ERROR(cache.Attend(layer, q.data(), n, out.data(), nullptr));
    if (outputs != nullptr) outputs->insert(outputs->end(), out.begin(), out.end());
  }
  return absl::OkStatus();
}

}  // namespace kvtier::testing
