#include "core/planning/capacity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/layout/geometry.h"
#include "core/status/status_macros.h"
#include "core/tiering/selection.h"

namespace kvtier::planning {
namespace {

// Upper limits: past them an input is a typo, not a host (each named in its error).
constexpr uint64_t kMaxLayers = 1024, kMaxHeads = 4096, kMaxHeadDim = 4096;
constexpr uint64_t kMaxGpus = 64, kMaxBatch = 65536, kMaxPageTokens = 65536;
constexpr uint64_t kMaxContext = uint64_t{1} << 24;  // 16M tokens
constexpr uint64_t kMaxPages = uint64_t{1} << 24;    // per sequence: the selection's input
constexpr double kMaxWeightBytes = 1e14;             // 100 TB
constexpr uint64_t kCompressedBlockAlignment = 16;   // worker/tiered_kv_store.cc

absl::Status InRange(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be in [", lo, ", ", hi, "], got ", value));
}

absl::Status PositiveAtMost(absl::string_view field, double value, double hi) {
  if (std::isfinite(value) && value > 0 && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be in (0, ", hi, "], got ", value));
}

absl::Status ValidateModel(const ModelGeometry& m) {
  RETURN_IF_ERROR(InRange("num_layers", m.num_layers, 1, kMaxLayers));
  RETURN_IF_ERROR(InRange("num_kv_heads", m.num_kv_heads, 1, kMaxHeads));
  RETURN_IF_ERROR(InRange("num_heads", m.num_heads, m.num_kv_heads, kMaxHeads));
  RETURN_IF_ERROR(InRange("head_dim", m.head_dim, 1, kMaxHeadDim));
  return PositiveAtMost("weight_bytes", m.weight_bytes, kMaxWeightBytes);
}

absl::Status ValidateHost(const HostModel& h, uint32_t gpus) {
  if (gpus % h.gpus_per_link != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus_per_link (", h.gpus_per_link, ") must divide gpus (", gpus, ")"));
  }
  if (gpus % h.sockets != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sockets (", h.sockets, ") must divide gpus (", gpus, ")"));
  }
  RETURN_IF_ERROR(PositiveAtMost("hbm_bytes_per_second", h.hbm_bytes_per_second, 1e14));
  RETURN_IF_ERROR(PositiveAtMost("link_bytes_per_second", h.link_bytes_per_second, 1e12));
  RETURN_IF_ERROR(PositiveAtMost("ddr_bytes_per_second", h.ddr_bytes_per_second, 1e13));
  RETURN_IF_ERROR(PositiveAtMost("cpu_attention_efficiency", h.cpu_attention_efficiency, 1));
  RETURN_IF_ERROR(PositiveAtMost("staging_bytes", h.staging_bytes, 1e13));
  RETURN_IF_ERROR(InRange("retier_interval", h.retier_interval, 1, 1u << 20));
  if (!(h.turnover_per_retier >= 0 && h.turnover_per_retier <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("turnover_per_retier must be in [0, 1], got ", h.turnover_per_retier));
  }
  return absl::OkStatus();
}

absl::Status Validate(const PlanInput& in, uint32_t tp) {
  RETURN_IF_ERROR(ValidateModel(in.model));
  RETURN_IF_ERROR(InRange("gpus", in.gpus, 1, kMaxGpus));
  RETURN_IF_ERROR(InRange("tensor_parallel", tp, 1, in.gpus));
  if (in.gpus % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel (", tp, ") must divide gpus (", in.gpus, ")"));
  }
  const uint32_t kv = in.model.num_kv_heads;
  if (kv % tp != 0 && tp % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel (", tp, ") must divide, or be a multiple of, num_kv_heads (", kv, ")"));
  }
  RETURN_IF_ERROR(InRange("batch", in.batch, 1, kMaxBatch));
  RETURN_IF_ERROR(InRange("context", in.context_tokens, 1, kMaxContext));
  RETURN_IF_ERROR(InRange("prompt_tokens", in.prompt_tokens, 0, in.context_tokens));
  RETURN_IF_ERROR(InRange("page_tokens", in.tiering.page_tokens, 1, kMaxPageTokens));
  RETURN_IF_ERROR(InRange("pages per sequence (context / page_tokens)",
                          (in.context_tokens + in.tiering.page_tokens - 1) / in.tiering.page_tokens,
                          1, kMaxPages));
  RETURN_IF_ERROR(in.tiering.Validate());
  RETURN_IF_ERROR(PositiveAtMost("gpu_memory_bytes", in.gpu_memory_bytes, 1e13));
  return absl::OkStatus();
}

// Tokens per tier of one sequence of `context` tokens at its last re-tiering, from the daemon's
// own selection: DESIGN.md §2's protected set and budgets. Scores are all equal (a plan does
// not know which tokens will matter); the counts do not depend on them.
absl::StatusOr<SequenceTiers> TiersOf(const PlanInput& in) {
  const uint32_t pt = in.tiering.page_tokens;
  const tiering::ProtectedPages prot = tiering::HierarchyProtectedPages(
      in.tiering, {.prompt_tokens = in.prompt_tokens, .length = in.context_tokens});
  std::vector<float> scores(prot.num_pages, 0.f);
  std::vector<tiering::Tier> out(prot.num_pages);
  ASSIGN_OR_RETURN(const tiering::GroupStats stats,
                   tiering::SelectGroup(scores, {}, prot, pt, in.context_tokens, in.tiering.budgets,
                                        0, absl::MakeSpan(out), nullptr));
  SequenceTiers t;
  t.protected_tokens = stats.protected_tokens;
  t.overflow_tokens = stats.overflow_tokens;
  uint64_t* per_tier[] = {&t.t0_tokens, &t.t1_tokens, &t.t2_tokens, &t.t3_tokens};
  for (uint64_t p = 0; p < out.size(); ++p) {
    *per_tier[static_cast<int>(out[p])] += std::min<uint64_t>(pt, in.context_tokens - p * pt);
  }
  return t;
}

}  // namespace

uint64_t Int8KiviPageBytes(uint32_t layers, uint64_t values_per_layer, uint32_t tokens) {
  auto align = [](uint64_t n) {
    return (n + kCompressedBlockAlignment - 1) / kCompressedBlockAlignment *
           kCompressedBlockAlignment;
  };
  const uint64_t codes = uint64_t{tokens} * values_per_layer;
  const uint64_t key = align(values_per_layer * 2 * sizeof(float) + codes);
  const uint64_t value = align(uint64_t{tokens} * 2 * sizeof(float) + codes);
  return uint64_t{layers} * (key + value);
}

double DenseParameterCount(uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t kv_heads,
                           uint32_t head_dim, uint64_t intermediate, uint64_t vocab, bool tied) {
  const double h = hidden, q = static_cast<double>(heads) * head_dim,
               kv = static_cast<double>(kv_heads) * head_dim;
  const double attention = h * q + 2 * h * kv + q * h;
  const double mlp = 3 * h * static_cast<double>(intermediate);
  const double embeddings = static_cast<double>(vocab) * h * (tied ? 1 : 2);
  return layers * (attention + mlp) + embeddings;
}

absl::StatusOr<Plan> ComputePlan(const PlanInput& input) {
  const uint32_t tp = input.tensor_parallel == 0 ? input.gpus : input.tensor_parallel;
  RETURN_IF_ERROR(Validate(input, tp));
  HostModel host = input.host;
  host.gpus = input.gpus;
  host.gpus_per_link = std::min(host.gpus_per_link, input.gpus);
  host.sockets = std::min(host.sockets, input.gpus);
  RETURN_IF_ERROR(InRange("gpus_per_link", host.gpus_per_link, 1, kMaxGpus));
  RETURN_IF_ERROR(InRange("sockets", host.sockets, 1, kMaxGpus));
  RETURN_IF_ERROR(ValidateHost(host, input.gpus));

  const ModelGeometry& m = input.model;
  Plan p;
  p.replicas = input.gpus / tp;
  p.kv_heads_per_gpu = std::max<uint32_t>(1, m.num_kv_heads / tp);
  const layout::KvGeometry whole{.num_layers = m.num_layers,
                                 .num_kv_heads = m.num_kv_heads,
                                 .head_dim = m.head_dim,
                                 .element_bytes = input.element_bytes,
                                 .page_tokens = input.tiering.page_tokens};
  RETURN_IF_ERROR(whole.Validate());
  layout::KvGeometry gpu = whole;
  gpu.num_kv_heads = p.kv_heads_per_gpu;
  p.kv_bytes_per_token = whole.BytesPerToken();
  p.mha_bytes_per_token = 2ull * m.num_layers * m.num_heads * m.head_dim * input.element_bytes;
  p.t1_page_bytes = gpu.PageBytes(0);
  p.t2_page_bytes =
      Int8KiviPageBytes(m.num_layers, gpu.ValuesPerTokenLayer(), input.tiering.page_tokens);

  ASSIGN_OR_RETURN(p.tiers, TiersOf(input));
  const uint64_t per_token = gpu.BytesPerToken();
  const uint64_t pt = input.tiering.page_tokens;
  p.seq_full_bytes = input.context_tokens * per_token;
  p.seq_t0_bytes = p.tiers.t0_tokens * per_token;
  p.seq_t1_bytes = p.tiers.t1_tokens / pt * p.t1_page_bytes;  // T1/T2 pages are whole
  p.seq_t2_bytes = p.tiers.t2_tokens / pt * p.t2_page_bytes;

  p.gpu_full_bytes = input.batch * p.seq_full_bytes;
  p.gpu_t0_bytes = input.batch * p.seq_t0_bytes;
  p.gpu_saved_bytes = p.gpu_full_bytes - p.gpu_t0_bytes;
  p.gpu_weight_bytes = m.weight_bytes / tp;
  const uint64_t gpu_t1 = input.batch * p.seq_t1_bytes, gpu_t2 = input.batch * p.seq_t2_bytes;
  p.host_t1_bytes = input.gpus * gpu_t1;
  p.host_t2_bytes = input.gpus * gpu_t2;
  const double staging = std::min<double>(host.staging_bytes, gpu_t1 + gpu_t2);
  p.fits_hbm_full = p.gpu_weight_bytes + p.gpu_full_bytes <= input.gpu_memory_bytes;
  p.fits_hbm_tiered = p.gpu_weight_bytes + p.gpu_t0_bytes + staging <= input.gpu_memory_bytes;

  p.step = PredictStep(host, {.weight_bytes = p.gpu_weight_bytes,
                              .t0_bytes = static_cast<double>(p.gpu_t0_bytes),
                              .t1_bytes = static_cast<double>(gpu_t1),
                              .t1_page_bytes = static_cast<double>(p.t1_page_bytes),
                              .t2_bytes = static_cast<double>(gpu_t2),
                              .t2_page_bytes = static_cast<double>(p.t2_page_bytes)});
  p.full_step_seconds = (p.gpu_weight_bytes + p.gpu_full_bytes) / host.hbm_bytes_per_second;
  return p;
}

}  // namespace kvtier::planning
