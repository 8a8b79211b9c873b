#include "edge/message_limits.h"

#include <random>

#include "gtest/gtest.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::edge {
namespace {

// Every field at its widest: the largest values each can carry.
v1::SubmitSnapshotRequest WidestSnapshot(uint64_t entries) {
  v1::SubmitSnapshotRequest r;
  r.set_worker_id(~0ull);
  r.set_sequence_id(~0ull);
  r.set_length(~0ull);
  r.set_decode_step(~0ull);
  r.set_num_pages(~0u);
  r.set_last_plan_version(~0ull);
  r.set_applied_plan_version(~0ull);
  r.set_session_secret(std::string(16, '\xff'));
  r.set_abandon_pending(true);
  r.mutable_page_scores()->Resize(static_cast<int>(entries), 3.4e38f);
  r.set_current_tiers(std::string(entries, '\x03'));
  return r;
}

v1::TierPlan WidestPlan(uint64_t entries) {
  v1::TierPlan p;
  p.set_sequence_id(~0ull);
  p.set_plan_version(~0ull);
  p.set_target_tiers(std::string(entries, '\x03'));
  for (uint64_t i = 0; i < entries; ++i) {
    p.add_move_group(~0u);
    p.add_move_page(~0u);
    p.add_move_dst_slot(~0ull);
    p.add_move_src_slot(~0ull);
  }
  p.set_move_from(std::string(entries, '\x02'));
  p.set_move_to(std::string(entries, '\x01'));
  p.set_degraded(true);
  p.set_degraded_reason(std::string(200, 'x'));  // the daemon's reasons are a few dozen bytes
  p.set_protected_overflow(true);
  p.set_ddr_extents(~0u);
  p.set_compressed_extents(~0u);
  v1::PlacementReport* r = p.mutable_report();
  r->set_tokens_t0(~0ull);
  r->set_tokens_t1(~0ull);
  r->set_tokens_t2(~0ull);
  r->set_tokens_t3(~0ull);
  r->set_evicted_fraction_generated(1);
  r->set_t0_bytes(~0ull);
  r->set_full_bytes(~0ull);
  // The widest schedule: a group for every page, each page's index at its widest.
  v1::PrefetchSchedule* s = p.mutable_schedule();
  s->set_h2d_bytes_per_step(~0ull);
  s->set_h2d_bytes_per_second(1e12);
  s->set_staging_bytes(~0ull);
  s->set_step_seconds(600);
  for (uint64_t i = 0; i < entries; ++i) s->add_groups()->add_in_place(~0u);
  return p;
}

TEST(MessageLimitsTest, TheLargestSnapshotAndPlanTheLimitsAllowFitTheBounds) {
  for (uint64_t entries : {uint64_t{1}, uint64_t{1000}, uint64_t{1} << 16, uint64_t{1} << 20}) {
    EXPECT_LE(WidestSnapshot(entries).ByteSizeLong(), MaxSnapshotBytes(entries)) << entries;
    EXPECT_LE(WidestPlan(entries).ByteSizeLong(), MaxPlanBytes(entries)) << entries;
  }
  // And not by a silly margin (the receive limit is also a defence).
  const uint64_t e = uint64_t{1} << 20;
  EXPECT_LT(MaxSnapshotBytes(e), 2 * WidestSnapshot(e).ByteSizeLong());
  EXPECT_LT(MaxPlanBytes(e), 2 * WidestPlan(e).ByteSizeLong());
}

TEST(MessageLimitsTest, TheHardCapFitsGrpcsIntLimit) {
  EXPECT_LT(MaxReplyBytes(), uint64_t{1} << 31);
  EXPECT_LT(MaxSnapshotBytes(kMaxSnapshotEntriesCap), uint64_t{1} << 31);
}

}  // namespace
}  // namespace kvtier::edge
