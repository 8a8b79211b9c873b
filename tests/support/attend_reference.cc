// kvtier-attend-reference: the C++ engine's attention on inputs a test wrote, so the Python
// binding's results can be compared with it. MODE "tiered": the cache kvtier-run drives (a
// local WorkerRuntime's TieredSequence, policy full), to compare bit for bit; "dense": the
// engine's reference DenseAttentionCache (another summation, close but not identical).
//
//   kvtier-attend-reference MODE Q_HEADS KV_HEADS HEAD_DIM SCALE IN OUT
//
// IN holds chunks, one per call: uint32 n, then K and V [n][KV_HEADS][HEAD_DIM] and
// Q [n][Q_HEADS][HEAD_DIM] as f32. OUT receives, per chunk, the output [n][Q_HEADS][HEAD_DIM]
// and the position mass [length] as f32. One layer.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/dense_attention_cache.h"
#include "worker/runtime/worker_runtime.h"

int main(int argc, char** argv) {
  const std::string mode = argc == 8 ? argv[1] : "";
  if (mode != "tiered" && mode != "dense") {
    std::cerr << "usage: kvtier-attend-reference tiered|dense Q_HEADS KV_HEADS HEAD_DIM SCALE IN "
                 "OUT\n";
    return 2;
  }
  const kvtier::worker::AttentionShape shape{.num_layers = 1,
                                             .num_q_heads = static_cast<uint32_t>(atoi(argv[2])),
                                             .num_kv_heads = static_cast<uint32_t>(atoi(argv[3])),
                                             .head_dim = static_cast<uint32_t>(atoi(argv[4])),
                                             .scale = strtof(argv[5], nullptr)};
  std::ifstream in(argv[6], std::ios::binary);
  std::ofstream out(argv[7], std::ios::binary);
  std::unique_ptr<kvtier::worker::WorkerRuntime> runtime;
  std::unique_ptr<kvtier::worker::AttentionCache> owned;
  if (mode == "dense") {
    owned = std::make_unique<kvtier::engine::DenseAttentionCache>(shape);
  } else {
    auto created = kvtier::worker::WorkerRuntime::Create(
        {.attention = shape, .page_tokens = 4, .arena_bytes = 64 << 20});
    if (!created.ok()) {
      std::cerr << created.status() << "\n";
      return 1;
    }
    runtime = *std::move(created);
    auto seq = runtime->Open({.policy = "full"});
    if (!seq.ok()) {
      std::cerr << seq.status() << "\n";
      return 1;
    }
    owned = *std::move(seq);
  }
  kvtier::worker::AttentionCache& cache = *owned;
  const size_t kv_row = size_t{shape.num_kv_heads} * shape.head_dim;
  const size_t q_row = size_t{shape.num_q_heads} * shape.head_dim;
  uint32_t n = 0;
  while (in.read(reinterpret_cast<char*>(&n), sizeof(n))) {
    std::vector<float> k(n * kv_row), v(n * kv_row), q(n * q_row), o(n * q_row);
    in.read(reinterpret_cast<char*>(k.data()), k.size() * 4);
    in.read(reinterpret_cast<char*>(v.data()), v.size() * 4);
    in.read(reinterpret_cast<char*>(q.data()), q.size() * 4);
    if (!in) {
      std::cerr << "kvtier-attend-reference: " << argv[5] << " ends inside a chunk\n";
      return 1;
    }
    if (auto s = cache.Append(0, k.data(), v.data(), n); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    std::vector<float> mass(cache.Length(0));
    if (auto s = cache.Attend(0, q.data(), n, o.data(), mass.data()); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    out.write(reinterpret_cast<const char*>(o.data()), o.size() * 4);
    out.write(reinterpret_cast<const char*>(mass.data()), mass.size() * 4);
  }
  return out.good() ? 0 : 1;
}
