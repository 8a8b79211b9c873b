#ifndef KVTIER_CORE_PLANNING_CAPACITY_H_
#define KVTIER_CORE_PLANNING_CAPACITY_H_

// The capacity planner behind `kvtierctl plan`: from a model's geometry, the host's GPUs, a
// batch, a context length and the tiering budgets, how much HBM, DDR and PCIe kvtier needs and
// saves. Pure: the caller reads the model file and /proc/meminfo. Thread-compatible.
//
// KV bytes per token are GQA-correct: 2 (K and V) × layers × KV heads × head_dim × element
// bytes. Counting query heads instead (as the seed paper's estimate did) is 7× too much for a
// model with 28 query heads and 4 KV heads.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/planning/step_model.h"
#include "core/tiering/config.h"

namespace kvtier::planning {

// What sizing needs of a model. `weight_bytes` is what one replica's weights occupy (and read
// each decode step): parameters × bytes per parameter, or a GGUF file's tensor bytes.
struct ModelGeometry {
  std::string name;
  uint32_t num_layers = 0;
  uint32_t num_heads = 0;     // query heads: only to report what an MHA estimate would say
  uint32_t num_kv_heads = 0;  // K/V heads (GQA): what the cache holds
  uint32_t head_dim = 0;
  double weight_bytes = 0;
};

struct PlanInput {
  ModelGeometry model;
  uint32_t gpus = 1;                // GPUs of the host
  uint32_t tensor_parallel = 0;     // GPUs per replica; 0 = all of them (one replica)
  uint32_t batch = 1;               // sequences decoding at once per replica
  uint64_t context_tokens = 0;      // tokens per sequence when the plan is read (its longest)
  uint64_t prompt_tokens = 0;       // of which the prompt: protected when tiering says so
  uint32_t element_bytes = 2;       // bf16/fp16 KV
  tiering::TieringConfig tiering;   // page_tokens, protected set, β / r / γ
  HostModel host;                   // gpus, gpus_per_link and sockets are set from `gpus`
  double gpu_memory_bytes = 141e9;  // HBM per GPU, for "fits in HBM"
};

// Per-tier token counts of one sequence, from the same selection the daemon runs.
struct SequenceTiers {
  uint64_t t0_tokens = 0, t1_tokens = 0, t2_tokens = 0, t3_tokens = 0;
  uint64_t protected_tokens = 0;
  uint64_t overflow_tokens = 0;  // protected tokens beyond ceil(β × live)
};

struct Plan {
  // Geometry.
  uint64_t kv_bytes_per_token = 0;   // whole model, all layers, K and V
  uint64_t mha_bytes_per_token = 0;  // the same counting query heads (the wrong estimate)
  uint32_t kv_heads_per_gpu = 0;     // KV heads each GPU of a replica holds (replicated
                                     // when tensor parallelism exceeds the KV heads)
  uint32_t replicas = 0;
  uint64_t t1_page_bytes = 0, t2_page_bytes = 0;  // per GPU (its heads), one page, all layers
  // One sequence, on one GPU (its share of the heads).
  SequenceTiers tiers;
  uint64_t seq_full_bytes = 0;  // what `full` keeps in HBM
  uint64_t seq_t0_bytes = 0;    // HBM kept
  uint64_t seq_t1_bytes = 0;    // DDR pool (T1)
  uint64_t seq_t2_bytes = 0;    // compressed pool (T2)
  // Per GPU (batch sequences) and per host (every GPU).
  uint64_t gpu_full_bytes = 0, gpu_t0_bytes = 0, gpu_saved_bytes = 0;
  double gpu_weight_bytes = 0;
  uint64_t host_t1_bytes = 0, host_t2_bytes = 0;  // the pools to configure
  bool fits_hbm_full = false, fits_hbm_tiered = false;
  StepPrediction step;           // per decode step, kvtier with and without schedules
  double full_step_seconds = 0;  // everything in HBM (no kvtier), if it fits
};

// INVALID_ARGUMENT naming the field, its value and the limit for out-of-range input: zero or
// absurd geometry, GPUs, batch or context; tensor_parallel not dividing gpus or not dividing
// (or divisible by) the KV heads; element_bytes not 1, 2 or 4; budgets outside DESIGN.md §2's
// ranges; a non-positive host rate.
absl::StatusOr<Plan> ComputePlan(const PlanInput& input);

// Bytes of one page of `tokens` positions in T2 under the int8 KIVI codec, for one GPU's
// `layers` × `values_per_layer` (KV heads × head_dim) values per token: per layer, K codes with
// an f32 scale and minimum per channel, V codes with an f32 scale and minimum per token, each
// block padded to 16 bytes (worker/codecs/int8_kivi.cc, KvLayout::ReservedBlockBytes).
uint64_t Int8KiviPageBytes(uint32_t layers, uint64_t values_per_layer, uint32_t tokens);

// Parameters of a dense decoder-only transformer (Llama/Qwen/Mistral layout: q/k/v/o attention
// projections, a gated MLP of three matrices, input embedding and an untied output head unless
// `tied`), norms and biases left out (under 0.1%).
double DenseParameterCount(uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t kv_heads,
                           uint32_t head_dim, uint64_t intermediate, uint64_t vocab, bool tied);

}  // namespace kvtier::planning

#endif  // KVTIER_CORE_PLANNING_CAPACITY_H_
