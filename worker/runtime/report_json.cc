#include "worker/runtime/report_json.h"

namespace kvtier::worker {

nlohmann::json SequenceReportJson(const SequenceReport& s) {
  return {
      {"prompt_tokens", s.prompt_tokens},
      {"length", s.length},
      {"t0_bytes", s.t0_bytes},
      {"t0_peak_bytes", s.t0_peak_bytes},
      {"t0_mean_bytes", s.t0_mean_bytes},
      {"full_mean_bytes", s.full_mean_bytes},
      {"full_bytes", s.full_bytes},
      {"ddr_bytes", s.ddr_bytes},
      {"compressed_bytes", s.compressed_bytes},
      {"tokens_by_tier", {s.tokens[0], s.tokens[1], s.tokens[2], s.tokens[3]}},
      {"evicted_generated_fraction", s.evicted_generated_fraction},
      {"offload_bytes", s.offload_bytes},
      {"compress_bytes", s.compress_bytes},
      {"promote_bytes", s.promote_bytes},
      {"decompress_bytes", s.decompress_bytes},
      {"plans", s.plans},
      {"degraded_plans", s.degraded_plans},
      {"local_plans", s.local_plans},
      {"protected_overflow_plans", s.protected_overflow_plans},
      {"schedules", s.schedules},
      {"schedules_refused", s.schedules_refused},
      {"schedule_bytes",
       {{"resident", s.resident_bytes}, {"stage", s.stage_bytes}, {"in_place", s.in_place_bytes}}},
      {"split_attends", s.split_attends},
      {"tier_seconds", s.tier_nanos / 1e9},
      {"attend_seconds", s.attend_nanos / 1e9},
      {"lost_mass",
       {{"compressed", s.lost_mass.compressed},
        {"evicted_estimate", s.lost_mass.evicted},
        {"total", s.lost_mass.total()},
        {"peak", s.lost_mass_peak}}},
  };
}

}  // namespace kvtier::worker
