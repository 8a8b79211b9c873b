// The store suite over the host backend (the same suite runs over CUDA in tests/gpu/cuda).

#include "tests/unit/worker/store_backend_suite.h"

namespace kvtier::worker::testing {
namespace {

class HostHarness final : public StoreHarness {
 public:
  std::unique_ptr<TieredKvStore> MakeStore(const TieredKvStoreOptions& options) override {
    return rig_.MakeStore(options);
  }
  absl::Status Append(TieredKvStore& store, uint32_t layer, const std::vector<float>& k,
                      const std::vector<float>& v, uint32_t n) override {
    return store.Append(layer, k.data(), v.data(), n);
  }
  absl::Status Attend(TieredKvStore& store, uint32_t layer, const std::vector<float>& q, uint32_t n,
                      std::vector<float>* out) override {
    out->assign(q.size(), 0.f);
    return store.Attend(layer, q.data(), n, out->data(), nullptr);
  }
  absl::Status AttendBatch(const std::vector<TieredKvStore*>& stores, uint32_t layer,
                           const std::vector<float>& q, std::vector<float>* out) override {
    out->assign(q.size(), 0.f);
    return TieredKvStore::AttendBatch(stores, layer, q.data(), out->data());
  }
};

INSTANTIATE_TEST_SUITE_P(Host, StoreBackendSuite,
                         ::testing::Values(HarnessFactory{
                             "Host", [] { return std::make_unique<HostHarness>(); }}),
                         HarnessName);

}  // namespace
}  // namespace kvtier::worker::testing
