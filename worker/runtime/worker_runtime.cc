#include "worker/runtime/worker_runtime.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status/status_macros.h"
#include "kvtier/client.h"
#include "worker/runtime/daemon_pools.h"
#ifdef KVTIER_WITH_CUDA
#include "worker/cuda/cuda_kv_backend.h"
#endif

namespace kvtier::worker {

WorkerRuntime::WorkerRuntime(const RuntimeOptions& options, layout::KvGeometry geometry)
    : options_(options), geometry_(geometry) {}

WorkerRuntime::~WorkerRuntime() = default;

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    const RuntimeOptions& options) {
  const AttentionShape& a = options.attention;
  layout::KvGeometry geometry{.num_layers = a.num_layers,
                              .num_kv_heads = a.num_kv_heads,
                              .head_dim = a.head_dim,
                              .element_bytes = options.kv_element_bytes,
                              .page_tokens = options.page_tokens,
                              .layer_groups = options.layer_groups};
  if (options.kv_element_bytes != 4 &&
      !(options.kv_element_bytes == 2 && options.backend == StoreBackend::kCuda)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_element_bytes must be 4 (f32), or 2 (bf16) on the CUDA backend, got ",
                     options.kv_element_bytes,
                     options.backend == StoreBackend::kHost ? " on the host backend" : ""));
  }
  RETURN_IF_ERROR(geometry.Validate());
  ASSIGN_OR_RETURN(const codecs::Codec* codec, codecs::FindCodec(options.codec));
  auto runtime = std::unique_ptr<WorkerRuntime>(new WorkerRuntime(options, geometry));
  RETURN_IF_ERROR(runtime->CreateBackends());
  if (options.daemon_address.empty()) {
    RETURN_IF_ERROR(runtime->CreateLocalPools());
    return runtime;
  }
  ClientOptions client;
  client.address = options.daemon_address;
  client.cuda_library = options.cuda_library;
  v1::RegisterWorkerRequest& r = client.registration;
  r.set_worker_name(absl::StrCat(options.worker_name, "-", getpid()));
  v1::ModelGeometry* g = r.mutable_geometry();
  g->set_num_layers(geometry.num_layers);
  g->set_num_kv_heads(geometry.num_kv_heads);
  g->set_head_dim(geometry.head_dim);
  g->set_element_bytes(geometry.element_bytes);
  g->set_page_tokens(geometry.page_tokens);
  g->set_layer_groups(geometry.layer_groups);
  g->set_model_name(options.worker_name);
  r.mutable_gpu()->set_name(options.backend == StoreBackend::kCuda ? "cuda" : "cpu");
  // Whatever was given goes to the daemon, which checks it (a bad figure fails Create).
  if (options.link.ByteSizeLong() > 0) *r.mutable_link() = options.link;
  r.set_hbm_budget_bytes(options.arena_bytes);
  uint64_t t1 = 0, t2 = 0;
  for (uint32_t grp = 0; grp < geometry.layer_groups; ++grp) {
    t1 = std::max(t1, DdrSlotBytes(geometry, grp));
    t2 = std::max(t2, CompressedSlotBytes(*codec, geometry, grp));
  }
  r.set_t1_page_bytes(t1);
  r.set_t2_page_bytes(t2);
  absl::StatusOr<std::unique_ptr<WorkerClient>> connected = WorkerClient::Connect(client);
  if (!connected.ok()) {
    // A registration the daemon refused keeps its code (the message names the field); anything
    // else means the daemon could not be reached.
    const absl::StatusCode code = connected.status().code();
    const bool refused = code == absl::StatusCode::kInvalidArgument ||
                         code == absl::StatusCode::kPermissionDenied ||
                         code == absl::StatusCode::kResourceExhausted;
    return absl::Status(
        refused ? code : absl::StatusCode::kUnavailable,
        absl::StrCat(refused ? "kvtierd at " : "cannot reach kvtierd at ", options.daemon_address,
                     refused ? " refused the registration: " : ": ", connected.status().message()));
  }
  runtime->client_ = *std::move(connected);
  return runtime;
}

absl::Status WorkerRuntime::CreateBackends() {
  if (options_.backend == StoreBackend::kHost) {
    host_arena_ = std::make_unique<HostArena>(options_.arena_bytes);
    arena_ = host_arena_.get();
    return absl::OkStatus();
  }
  if (options_.backend != StoreBackend::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend must be kHost or kCuda, got ", static_cast<int>(options_.backend)));
  }
#ifdef KVTIER_WITH_CUDA
  ASSIGN_OR_RETURN(backends_,
                   cuda::MakeCudaStoreBackends(options_.arena_bytes, options_.cuda_stream));
  arena_ = &backends_->arena();
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("kvtier was built without CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<TieredKvStore>> WorkerRuntime::MakeStore(
    const TieredKvStoreOptions& options, const StoreMemory& memory) {
  if (backends_ == nullptr) return TieredKvStore::Create(options, memory);
  ASSIGN_OR_RETURN(std::unique_ptr<KvBackend> backend, backends_->MakeBackend(options));
  return TieredKvStore::Create(options, memory, std::move(backend));
}

absl::Status WorkerRuntime::CreateLocalPools() {
  ASSIGN_OR_RETURN(local_ddr_, HostPagePool::Create(PoolKind::kDdr, options_.local_ddr_bytes));
  ASSIGN_OR_RETURN(local_compressed_,
                   HostPagePool::Create(PoolKind::kCompressed, options_.local_compressed_bytes));
  local_slots_ = std::make_unique<LocalSlotAllocator>(std::vector<LocalSlotAllocator::PoolSpec>{
      {PoolKind::kDdr, options_.local_ddr_bytes},
      {PoolKind::kCompressed, options_.local_compressed_bytes}});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TieredSequence>> WorkerRuntime::Open(
    const SequenceOptions& options) {
  tiering::TieringConfig config = options.tiering;
  config.page_tokens = geometry_.page_tokens;
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<tiering::Policy> policy,
                   tiering::MakePolicy(options.policy, config));
  if (policy->NeedsWorkerState()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy \"", options.policy,
        "\" needs per-head state: it runs in the evaluation (kvtier-run eval), not here"));
  }
  ASSIGN_OR_RETURN(
      tiering::ScoreAccumulator scores,
      tiering::ScoreAccumulator::Create(geometry_.num_layers, options_.attention.num_q_heads,
                                        geometry_.layer_groups));
  TieredKvStoreOptions store_options{.geometry = geometry_,
                                     .num_q_heads = options_.attention.num_q_heads,
                                     .scale = options_.attention.scale,
                                     .codec = options_.codec,
                                     .portable_kernel = options_.portable_kernel};
  SequenceOptions seq_options = options;
  seq_options.tiering = config;

  if (client_ == nullptr) {
    ASSIGN_OR_RETURN(auto store,
                     MakeStore(store_options, {arena_, local_ddr_.get(), local_compressed_.get()}));
    auto seq = std::unique_ptr<TieredSequence>(
        new TieredSequence(seq_options, std::move(store), std::move(scores), std::move(policy)));
    seq->local_slots_ = local_slots_.get();
    return seq;
  }
  // kvtierd reads 0 as its default (the wire cannot tell 0 from unset): refuse rather than have
  // the daemon place by another protected set than the one asked for.
  if (config.sink_tokens == 0 || config.window_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.sink_tokens == 0 ? "sink_tokens" : "window_tokens",
                     " 0 cannot reach kvtierd, which reads 0 as its default (",
                     config.sink_tokens == 0 ? "4" : "128", "): use at least 1, or local pools"));
  }
  v1::PolicyConfig wire;
  wire.set_name(options.policy);
  wire.set_hbm_ratio(config.budgets.hbm_ratio);
  wire.set_evict_ratio(config.budgets.evict_ratio);
  wire.set_compress_ratio(config.budgets.compress_ratio);
  wire.set_sink_tokens(config.sink_tokens);
  wire.set_window_tokens(config.window_tokens);
  wire.set_protect_prompt(config.protect_prompt);
  wire.set_page_score_max(config.page_score == tiering::kMax);
  if (std::isfinite(config.budgets.max_lost_mass)) {
    wire.set_max_lost_mass(config.budgets.max_lost_mass);
  }
  const uint64_t generation = client_->generation();
  std::shared_ptr<PoolMapping> ddr = client_->pool(v1::POOL_KIND_DDR);
  std::shared_ptr<PoolMapping> compressed = client_->pool(v1::POOL_KIND_COMPRESSED);
  if (ddr == nullptr || compressed == nullptr) {
    return absl::UnavailableError("kvtierd gave no pools; is it running?");
  }
  auto ddr_pool = PoolOverMapping(PoolKind::kDdr, ddr);
  auto compressed_pool = PoolOverMapping(PoolKind::kCompressed, compressed);
  ASSIGN_OR_RETURN(auto store,
                   MakeStore(store_options, {arena_, ddr_pool.get(), compressed_pool.get()}));
  ASSIGN_OR_RETURN(uint64_t id, client_->OpenSequence(options.prompt_tokens, wire, options.tag, 0,
                                                      options.protected_prompt_begin));
  auto seq = std::unique_ptr<TieredSequence>(
      new TieredSequence(seq_options, std::move(store), std::move(scores), std::move(policy)));
  seq->client_ = client_.get();
  seq->sequence_id_ = id;
  seq->wire_policy_ = wire;
  seq->lane_ = std::make_unique<DaemonLane>(client_.get());
  seq->generation_ = generation;
  seq->ddr_mapping_ = std::move(ddr);
  seq->compressed_mapping_ = std::move(compressed);
  seq->ddr_pool_ = std::move(ddr_pool);
  seq->compressed_pool_ = std::move(compressed_pool);
  return seq;
}

}  // namespace kvtier::worker
