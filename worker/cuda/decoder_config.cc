#include "worker/cuda/decoder_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/layout/geometry.h"
#include "core/layout/shm_abi.h"
#include "core/status/status_macros.h"

namespace kvtier::worker::cuda {
namespace {

// Both the device arena's and the pool's slot granularity.
constexpr uint64_t kAlignment = layout::kSlotAlignment;
// A pool nothing is offloaded to (a local runtime always maps both kinds).
constexpr uint64_t kUnusedPoolBytes = 64 << 10;

uint64_t AlignUp(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

absl::Status ValidateSizes(const DecoderOptions& o) {
  if (o.batch == 0 || o.batch > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be in [1, 1024], got ", o.batch));
  }
  if (o.context_tokens == 0) {
    return absl::InvalidArgumentError("context_tokens must be > 0, got 0");
  }
  if (o.max_new_tokens == 0) {
    return absl::InvalidArgumentError("max_new_tokens must be > 0, got 0");
  }
  if (o.page_tokens == 0) return absl::InvalidArgumentError("page_tokens must be > 0, got 0");
  if (uint64_t{o.context_tokens} + o.max_new_tokens > (1ull << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_tokens + max_new_tokens must be <= ", 1ull << 31, ", got ",
                     o.context_tokens, " + ", o.max_new_tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateTiering(const DecoderTiering& t) {
  for (const auto& [name, ratio] :
       {std::pair{"hbm_ratio", t.hbm_ratio}, std::pair{"evict_ratio", t.evict_ratio}}) {
    if (!(ratio >= 0.0 && ratio <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tiering.", name, " must be in [0, 1], got ", ratio));
    }
  }
  if (t.retier_interval == 0) {
    return absl::InvalidArgumentError("tiering.retier_interval must be > 0, got 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecoderConfig> MakeDecoderConfig(const AttentionShape& shape,
                                                const DecoderOptions& options) {
  RETURN_IF_ERROR(ValidateSizes(options));
  if (options.mode == KvMode::kHierarchy) RETURN_IF_ERROR(ValidateTiering(options.tiering));
  DecoderConfig c;
  c.runtime.attention = shape;
  c.runtime.page_tokens = options.page_tokens;
  c.runtime.layer_groups = 1;
  c.runtime.backend = StoreBackend::kCuda;
  c.runtime.kv_element_bytes = options.bf16_kv ? 2 : 4;
  const layout::KvGeometry geometry{.num_layers = shape.num_layers,
                                    .num_kv_heads = shape.num_kv_heads,
                                    .head_dim = shape.head_dim,
                                    .element_bytes = c.runtime.kv_element_bytes,
                                    .page_tokens = options.page_tokens,
                                    .layer_groups = 1};
  RETURN_IF_ERROR(geometry.Validate());
  c.pages_per_sequence =
      geometry.NumPages(uint64_t{options.context_tokens} + options.max_new_tokens);
  c.page_bytes = geometry.PageBytes(0);
  c.geometry = geometry;
  const uint64_t all_pages = uint64_t{options.batch} * c.pages_per_sequence;
  c.runtime.arena_bytes = all_pages * AlignUp(c.page_bytes);
  // Full mode never offloads; the pools still exist (a local runtime always maps two).
  c.runtime.local_ddr_bytes =
      options.mode == KvMode::kFull ? kUnusedPoolBytes : all_pages * AlignUp(c.page_bytes);
  c.runtime.local_compressed_bytes = kUnusedPoolBytes;  // compress_ratio is 0: nothing goes to T2

  const DecoderTiering& t = options.tiering;
  c.sequence.policy = options.mode == KvMode::kFull ? "full" : "hierarchy";
  c.sequence.prompt_tokens = std::min(t.prompt_tokens, options.context_tokens);
  c.sequence.tag = "gpu-decoder";
  tiering::TieringConfig& tc = c.sequence.tiering;
  tc.page_tokens = options.page_tokens;
  tc.sink_tokens = t.sink_tokens;
  tc.window_tokens = t.window_tokens;
  tc.protect_prompt = true;
  tc.retier_interval = t.retier_interval;
  if (options.mode == KvMode::kHierarchy) {
    tc.budgets = {.evict_ratio = t.evict_ratio, .hbm_ratio = t.hbm_ratio, .compress_ratio = 0};
  }
  RETURN_IF_ERROR(tc.Validate());
  return c;
}

}  // namespace kvtier::worker::cuda
