#include "tests/integration/support/sim_worker.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status/status_macros.h"

namespace kvtier::testing {
namespace {

// A cheap deterministic byte pattern per (stamp, offset).
inline uint8_t PatternByte(uint32_t stamp, uint64_t i) {
  uint64_t x = (uint64_t{stamp} * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  return static_cast<uint8_t>(x >> 56);
}

// Extents the worker has mapped over both pools (each grows as grants need room).
uint64_t MappedExtents(const WorkerClient& client) {
  uint64_t n = 0;
  for (v1::PoolKind kind : {v1::POOL_KIND_DDR, v1::POOL_KIND_COMPRESSED}) {
    if (std::shared_ptr<PoolMapping> pool = client.pool(kind)) n += pool->mapped_extents();
  }
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SimWorker>> SimWorker::Connect(const SimWorkerOptions& options) {
  auto w = std::unique_ptr<SimWorker>(new SimWorker(options));
  if (w->options_.policy.name().empty()) {
    w->options_.policy.set_name("hierarchy");
    w->options_.policy.set_hbm_ratio(0.5);
    w->options_.policy.set_evict_ratio(0.05);
    w->options_.policy.set_compress_ratio(0.2);
    w->options_.policy.set_protect_prompt(true);
  }
  ClientOptions client;
  client.address = options.address;
  client.rpc_deadline = absl::Seconds(5);
  client.background_heartbeat = options.background_heartbeat;
  client.heartbeat_over_channel = options.heartbeat_over_channel;
  client.cuda_library = options.cuda_library;
  v1::RegisterWorkerRequest& r = client.registration;
  r.set_worker_name(absl::StrCat(options.name, "-", getpid()));
  v1::ModelGeometry* g = r.mutable_geometry();
  g->set_model_name("sim");
  g->set_num_layers(2);
  g->set_num_kv_heads(1);
  g->set_head_dim(64);
  g->set_element_bytes(4);
  g->set_page_tokens(options.page_tokens);
  g->set_layer_groups(1);
  r.mutable_gpu()->set_name("cpu");
  r.set_t1_page_bytes(options.t1_page_bytes);
  r.set_t2_page_bytes(options.t2_page_bytes);
  r.set_pool_memory(options.pool_memory);
  ASSIGN_OR_RETURN(w->client_, WorkerClient::Connect(client));
  return w;
}

absl::StatusOr<int> SimWorker::Open() {
  ASSIGN_OR_RETURN(uint64_t id, client_->OpenSequence(options_.prompt_tokens, options_.policy,
                                                      absl::StrCat("seq-", next_)));
  Sequence s;
  s.id = id;
  sequences_[next_] = std::move(s);
  return next_++;
}

uint64_t SimWorker::SlotBytes(uint8_t tier) const {
  return tier == 1 ? options_.t1_page_bytes : options_.t2_page_bytes;
}

void SimWorker::Fill(uint8_t tier, uint64_t slot, uint32_t stamp) {
  auto pool = client_->pool(tier == 1 ? v1::POOL_KIND_DDR : v1::POOL_KIND_COMPRESSED);
  uint8_t* p = pool->data() + slot;
  for (uint64_t i = 0; i < SlotBytes(tier); ++i) p[i] = PatternByte(stamp, i);
}

bool SimWorker::Check(uint8_t tier, uint64_t slot, uint32_t stamp) const {
  auto pool = client_->pool(tier == 1 ? v1::POOL_KIND_DDR : v1::POOL_KIND_COMPRESSED);
  const uint8_t* p = pool->data() + slot;
  for (uint64_t i = 0; i < SlotBytes(tier); ++i) {
    if (p[i] != PatternByte(stamp, i)) return false;
  }
  return true;
}

absl::Status SimWorker::Verify(const Sequence& s) const {
  for (size_t i = 0; i < s.pages.size(); ++i) {
    const Page& p = s.pages[i];
    if ((p.tier == 1 || p.tier == 2) && !Check(p.tier, p.slot, p.stamp)) {
      return absl::InternalError(absl::StrCat("sequence ", s.id, " page ", i, " in T", int{p.tier},
                                              " slot ", p.slot,
                                              " lost its bytes (slot shared or freed early)"));
    }
  }
  return absl::OkStatus();
}

absl::Status SimWorker::Step(int i, uint64_t tokens) {
  Sequence& s = sequences_.at(i);
  s.length += tokens;
  const uint64_t num_pages = (s.length + options_.page_tokens - 1) / options_.page_tokens;
  s.pages.resize(num_pages);
  s.scores.resize(num_pages, 0.f);
  std::uniform_real_distribution<float> score(0.f, 1.f);
  for (uint64_t p = 0; p < num_pages; ++p) {
    if (s.pages[p].tier != 3) s.scores[p] += score(rng_);
  }
  v1::SubmitSnapshotRequest snap;
  snap.set_sequence_id(s.id);
  snap.set_length(s.length);
  snap.set_num_pages(static_cast<uint32_t>(num_pages));
  snap.set_last_plan_version(s.acked_version);
  std::string tiers;
  for (const Page& p : s.pages) tiers.push_back(static_cast<char>(p.tier));
  snap.set_current_tiers(tiers);
  for (float f : s.scores) snap.add_page_scores(f);
  if (options_.report_lost_mass) {
    double all = 0, compressed = 0, evicted = 0;
    for (uint64_t p = 0; p < num_pages; ++p) {
      all += s.scores[p];
      if (s.pages[p].tier == 2) compressed += s.scores[p];
      if (s.pages[p].tier == 3) evicted += s.scores[p];
    }
    snap.mutable_lost_mass()->set_compressed(all > 0 ? 0.05 * compressed / all : 0);
    snap.mutable_lost_mass()->set_evicted_estimate(all > 0 ? evicted / all : 0);
  }
  ASSIGN_OR_RETURN(v1::TierPlan plan, client_->SubmitSnapshot(snap));

  // Execute in order: read the source (checking its bytes), write the destination.
  const std::vector<Page> before = s.pages;
  for (int m = 0; m < plan.move_page_size(); ++m) {
    uint32_t page = plan.move_page(m);
    uint8_t from = static_cast<uint8_t>(plan.move_from()[m]);
    uint8_t to = static_cast<uint8_t>(plan.move_to()[m]);
    if (page >= num_pages || s.pages[page].tier != from) {
      return absl::InternalError(absl::StrCat("move ", m, " takes page ", page, " from T",
                                              int{from}, " but it is in T",
                                              page < num_pages ? int{s.pages[page].tier} : -1));
    }
    if (before[page].tier == 3 && to != 3) {
      return absl::InternalError(absl::StrCat("evicted page ", page, " was brought back"));
    }
    Page& p = s.pages[page];
    if ((from == 1 || from == 2) && !Check(from, p.slot, p.stamp)) {
      return absl::InternalError(absl::StrCat("source slot of page ", page, " was corrupted"));
    }
    p.tier = to;
    p.slot = plan.move_dst_slot(m);
    if (to == 1 || to == 2) {
      p.stamp = next_stamp_++;
      Fill(to, p.slot, p.stamp);
    }
  }
  for (uint64_t p = 0; p < num_pages; ++p) {
    if (static_cast<uint8_t>(plan.target_tiers()[p]) != s.pages[p].tier) {
      return absl::InternalError(absl::StrCat("after the moves page ", p, " is in T",
                                              int{s.pages[p].tier}, ", the plan's target is T",
                                              int{static_cast<uint8_t>(plan.target_tiers()[p])}));
    }
  }
  // Protected: the prompt, the first 4 generated tokens and the last 128 positions stay in T0.
  const uint64_t window = 128, sinks = 4;
  for (uint64_t p = 0; p < num_pages; ++p) {
    uint64_t first = p * options_.page_tokens;
    uint64_t last = std::min(s.length, first + options_.page_tokens) - 1;
    bool is_protected = first < options_.prompt_tokens + sinks || last + window >= s.length;
    if (is_protected && s.pages[p].tier != 0) {
      return absl::InternalError(absl::StrCat("protected page ", p, " left T0"));
    }
  }
  RETURN_IF_ERROR(client_->AckPlan(s.id, plan.plan_version(), true));
  s.acked_version = plan.plan_version();
  ++stats_.plans;
  stats_.moves += plan.move_page_size();
  stats_.degraded += plan.degraded();
  if (plan.degraded()) stats_.degraded_reason = plan.degraded_reason();
  stats_.verified_pages += num_pages;
  for (const auto& [_, seq] : sequences_) RETURN_IF_ERROR(Verify(seq));
  return absl::OkStatus();
}

absl::Status SimWorker::Close(int i) {
  RETURN_IF_ERROR(client_->CloseSequence(sequences_.at(i).id));
  sequences_.erase(i);
  return absl::OkStatus();
}

void RunSimWorkerProcess(const std::string& address, uint64_t seed, int progress_fd) {
  std::mt19937_64 rng(seed);
  SimProgress progress;
  for (;;) {
    SimWorkerOptions o;
    o.address = address;
    o.seed = rng();
    auto w = SimWorker::Connect(o);
    if (!w.ok()) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    std::vector<int> seqs;
    uint64_t degraded = 0, mapped = 0;
    for (int i = 0; i < 2; ++i) {
      if (auto s = (*w)->Open(); s.ok()) seqs.push_back(*s);
    }
    for (int round = 0; round < 200 && !seqs.empty(); ++round) {
      const int i = seqs[rng() % seqs.size()];
      absl::Status s = (*w)->Step(i, 32 + rng() % 64);
      if (s.code() == absl::StatusCode::kInternal) {
        std::fprintf(stderr, "worker %d: %s\n", getpid(), std::string(s.message()).c_str());
        _exit(kSimCorrupted);
      }
      if (!s.ok()) break;  // start over with fresh sequences
      progress.worker_id = (*w)->client().worker_id();
      ++progress.steps;
      const SimStats& stats = (*w)->stats();
      if (stats.degraded > degraded) {
        progress.cannot_grow += absl::StrContains(stats.degraded_reason, "the pool cannot grow");
        degraded = stats.degraded;
      }
      const uint64_t now_mapped = MappedExtents((*w)->client());
      progress.grown += now_mapped > mapped;
      mapped = now_mapped;
      if (progress_fd >= 0) (void)!write(progress_fd, &progress, sizeof(progress));
      absl::SleepFor(absl::Milliseconds(5 + rng() % 10));
    }
    for (int i : seqs) (void)(*w)->Close(i);
  }
}

}  // namespace kvtier::testing
