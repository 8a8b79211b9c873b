#ifndef KVTIER_WORKER_CUDA_PLACEMENT_SPLIT_H_
#define KVTIER_WORKER_CUDA_PLACEMENT_SPLIT_H_

// A deterministic page placement for the GPU bench and tests, standing in for the daemon's plan:
// the `hierarchy` budgets of DESIGN.md section 2 applied once to a chain, with a seeded hash as
// each page's score. Pure, no CUDA.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::worker::cuda {

enum class PageTier : uint8_t { kT0 = 0, kT1 = 1, kEvicted = 3 };

struct SplitKnobs {
  double hbm_ratio = 0.5;     // beta
  double evict_ratio = 0.03;  // r
  uint32_t prompt_tokens = 128;
  uint32_t sink_tokens = 4;
  uint32_t window_tokens = 128;
  uint64_t seed = 1;
};

struct PageSplit {
  std::vector<PageTier> tier;  // per page
  uint32_t protected_pages = 0;
  uint32_t eligible_pages = 0;  // non-protected
  uint32_t t0_pages = 0;        // including protected
  uint32_t t1_pages = 0;
  uint32_t evicted_pages = 0;
};

// Places the pages of a chain of `length` tokens (pages of `page_tokens`). Protected pages (any
// page touching the prompt, the first sink_tokens generated positions or the last window_tokens
// positions) are T0. Of the eligible pages, floor(r * eligible) lowest-scoring are evicted; T0
// holds up to ceil(beta * live pages) including the protected ones, best scores first; the rest
// are T1. INVALID_ARGUMENT for a ratio outside [0, 1] or zero length / page_tokens.
absl::StatusOr<PageSplit> SplitPages(uint32_t length, uint32_t page_tokens,
                                     const SplitKnobs& knobs);

}  // namespace kvtier::worker::cuda

#endif  // KVTIER_WORKER_CUDA_PLACEMENT_SPLIT_H_
