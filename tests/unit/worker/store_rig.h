#ifndef KVTIER_TESTS_UNIT_WORKER_STORE_RIG_H_
#define KVTIER_TESTS_UNIT_WORKER_STORE_RIG_H_

// Test rig: a TieredKvStore over local host memory (arena, DDR and compressed pools, a local
// slot allocator), plus random K/V/Q generation.

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device_arena.h"
#include "worker/page_pool.h"
#include "worker/tiered_kv_store.h"

namespace kvtier::worker::testing {

inline layout::KvGeometry SmolLmGeometry(uint32_t page_tokens, uint32_t layer_groups = 1) {
  layout::KvGeometry g;
  g.num_layers = 30;
  g.num_kv_heads = 3;
  g.head_dim = 64;
  g.element_bytes = 4;
  g.page_tokens = page_tokens;
  g.layer_groups = layer_groups;
  return g;
}

struct Rig {
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<HostPagePool> ddr, compressed;
  std::unique_ptr<LocalSlotAllocator> slots;

  explicit Rig(uint64_t arena_bytes = uint64_t{1} << 30, uint64_t pool_bytes = uint64_t{1} << 25) {
    arena = std::make_unique<HostArena>(arena_bytes);
    ddr = *HostPagePool::Create(PoolKind::kDdr, pool_bytes);
    compressed = *HostPagePool::Create(PoolKind::kCompressed, pool_bytes);
    slots = std::make_unique<LocalSlotAllocator>(std::vector<LocalSlotAllocator::PoolSpec>{
        {PoolKind::kDdr, pool_bytes}, {PoolKind::kCompressed, pool_bytes}});
  }
  StoreMemory Memory() const { return {arena.get(), ddr.get(), compressed.get()}; }

  std::unique_ptr<TieredKvStore> MakeStore(const TieredKvStoreOptions& options) const {
    auto store = TieredKvStore::Create(options, Memory());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
};

inline std::vector<float> RandomVector(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Appends n random tokens to every layer of `store` (and returns them: [layer][K|V]).
inline void AppendRandom(std::mt19937& rng, TieredKvStore& store, uint32_t n) {
  const auto& g = store.geometry();
  const size_t row = size_t{g.num_kv_heads} * g.head_dim;
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    auto k = RandomVector(rng, n * row), v = RandomVector(rng, n * row);
    ASSERT_TRUE(store.Append(layer, k.data(), v.data(), n).ok());
  }
}

}  // namespace kvtier::worker::testing

#endif  // KVTIER_TESTS_UNIT_WORKER_STORE_RIG_H_
