#ifndef KVTIER_TESTS_UNIT_DAEMON_CORE_TEST_UTIL_H_
#define KVTIER_TESTS_UNIT_DAEMON_CORE_TEST_UTIL_H_

// Helpers for DaemonCore tests: small real pools, a FakeClock and a simulated worker that keeps
// its own view of every sequence's placement and slots, as a real worker would.

#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock/clock.h"
#include "daemon/daemon_core.h"
#include "daemon/daemon_core_impl.h"
#include "daemon/metrics.h"
#include "gtest/gtest.h"

namespace kvtier::daemon::testing {

inline CoreOptions SmallOptions(uint64_t ddr = 8ull << 20, uint64_t cmp = 4ull << 20) {
  CoreOptions o;
  o.ddr_pool_bytes = ddr;
  o.compressed_pool_bytes = cmp;
  o.shm_prefix = "/kvtier-test";
  o.lease_ttl = absl::Seconds(10);
  o.max_sequences_per_worker = 8;
  o.max_workers = 8;
  return o;
}

struct Env {
  explicit Env(const CoreOptions& o = SmallOptions()) : metrics(Metrics::Create()) {
    auto c = DaemonCore::Create(o, &clock, metrics.get());
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) core = std::move(*c);
  }
  FakeClock clock;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<DaemonCore> core;
};

// WorkerRequest's T1 page, and the pages of tier `t` in a tier string (group-major, one byte each).
inline constexpr uint64_t kT1Slot = 8192;
inline int CountTier(const std::string& tiers, int t) {
  int n = 0;
  for (char c : tiers) n += c == t;
  return n;
}

// This process as the kernel would name it on the memory channel.
inline edge::PeerCredentials SelfPeer() { return {getuid(), getgid(), getpid(), {}}; }

// A registration ticket for `peer` (what the memory channel's hello returns).
inline std::string Ticket(DaemonCore* core, const edge::PeerCredentials& peer = SelfPeer()) {
  auto hello = core->Hello(peer);
  EXPECT_TRUE(hello.ok()) << hello.status();
  return hello.ok() ? hello->ticket() : "";
}

// RegisterWorker with a fresh ticket.
inline absl::StatusOr<v1::RegisterWorkerResponse> Register(DaemonCore* core,
                                                           v1::RegisterWorkerRequest r) {
  r.set_channel_ticket(Ticket(core));
  return core->RegisterWorker(r);
}

// 4 layers, 2 KV heads, head_dim 16, f16, 16-token pages: 8192-byte T1 pages.
inline v1::RegisterWorkerRequest WorkerRequest(uint32_t layer_groups = 1) {
  v1::RegisterWorkerRequest r;
  r.set_worker_name("test:1");
  r.set_pid(1);
  auto* g = r.mutable_geometry();
  g->set_model_name("tiny");
  g->set_num_layers(4);
  g->set_num_kv_heads(2);
  g->set_head_dim(16);
  g->set_element_bytes(2);
  g->set_page_tokens(16);
  g->set_layer_groups(layer_groups);
  r.set_t1_page_bytes(2ull * 16 * 2 * 16 * 2 * 4 / layer_groups);
  r.set_t2_page_bytes(2ull * 16 * 2 * 16 * 4 / layer_groups + 512);
  r.mutable_gpu()->set_name("cpu");
  return r;
}

inline v1::PolicyConfig Policy(const std::string& name, double hbm, double evict, double compress) {
  v1::PolicyConfig p;
  p.set_name(name);
  p.set_hbm_ratio(hbm);
  p.set_evict_ratio(evict);
  p.set_compress_ratio(compress);
  p.set_protect_prompt(true);
  p.set_window_tokens(64);
  return p;
}

// A worker's view: placement and slots it was granted, per sequence.
class SimWorker {
 public:
  struct Seq {
    uint64_t prompt = 0;
    uint64_t length = 0;
    uint32_t num_pages = 0;
    std::string tiers;            // group-major
    std::vector<uint64_t> slots;  // parallel; valid when tier is 1 or 2
    uint64_t last_plan = 0;
  };

  SimWorker(DaemonCore* core, uint32_t groups = 1) : SimWorker(core, WorkerRequest(groups)) {}
  // Registers `request` (its geometry's layer_groups are the worker's).
  SimWorker(DaemonCore* core, const v1::RegisterWorkerRequest& request)
      : SimWorker(core, request, SelfPeer()) {}
  // Registers `request` as `peer` says the kernel named it at the channel hello.
  SimWorker(DaemonCore* core, v1::RegisterWorkerRequest request, const edge::PeerCredentials& peer)
      : core_(core), groups_(request.geometry().layer_groups()) {
    request.set_channel_ticket(Ticket(core, peer));
    auto r = core->RegisterWorker(request);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) resp_ = *r;
  }
  uint64_t id() const { return resp_.worker_id(); }
  const std::string& secret() const { return resp_.session_secret(); }
  // Fills worker_id and session_secret: what every request after registration carries.
  template <typename Request>
  Request Signed(Request r) const {
    r.set_worker_id(id());
    r.set_session_secret(secret());
    return r;
  }
  const v1::RegisterWorkerResponse& registration() const { return resp_; }
  Seq& seq(uint64_t id) { return seqs_[id]; }

  absl::StatusOr<uint64_t> Open(uint64_t prompt, const v1::PolicyConfig& policy) {
    v1::OpenSequenceRequest r = Signed(v1::OpenSequenceRequest());
    r.set_prompt_tokens(prompt);
    *r.mutable_policy() = policy;
    auto s = core_->OpenSequence(r);
    if (!s.ok()) return s.status();
    seqs_[s->sequence_id()].prompt = prompt;
    return s->sequence_id();
  }

  // A snapshot at `length` with the given page scores (one per page of group 0, repeated over
  // groups with a small offset), current tiers from the worker's view.
  v1::SubmitSnapshotRequest MakeSnapshot(uint64_t seq_id, uint64_t length,
                                         const std::vector<float>& scores) {
    Seq& s = seqs_[seq_id];
    uint32_t n = static_cast<uint32_t>((length + 15) / 16);
    Grow(s, n);
    s.length = length;
    v1::SubmitSnapshotRequest r = Signed(v1::SubmitSnapshotRequest());
    r.set_sequence_id(seq_id);
    r.set_length(length);
    r.set_num_pages(n);
    for (uint32_t g = 0; g < groups_; ++g) {
      for (uint32_t p = 0; p < n; ++p) r.add_page_scores(scores[p % scores.size()] + g);
    }
    r.set_current_tiers(s.tiers);
    r.set_last_plan_version(s.last_plan);
    return r;
  }

  absl::StatusOr<v1::TierPlan> Snapshot(uint64_t seq_id, uint64_t length,
                                        const std::vector<float>& scores) {
    return core_->SubmitSnapshot(MakeSnapshot(seq_id, length, scores));
  }

  // Acknowledges; when applied, updates the worker's view like a plan executor would.
  absl::Status Ack(const v1::TierPlan& plan, bool applied) {
    v1::AckPlanRequest r = Signed(v1::AckPlanRequest());
    r.set_sequence_id(plan.sequence_id());
    r.set_plan_version(plan.plan_version());
    r.set_applied(applied);
    absl::Status st = core_->AckPlan(r).status();
    if (!st.ok()) return st;
    if (applied) {
      Apply(plan);
    } else {
      seqs_[plan.sequence_id()].last_plan = plan.plan_version();
    }
    return st;
  }

  // Executes the plan on the worker's view only (the ack is left to the caller).
  void Apply(const v1::TierPlan& plan) {
    Seq& s = seqs_[plan.sequence_id()];
    s.last_plan = plan.plan_version();
    for (int i = 0; i < plan.move_group_size(); ++i) {
      size_t idx = size_t{plan.move_group(i)} * s.num_pages + plan.move_page(i);
      s.tiers[idx] = plan.move_to()[i];
      s.slots[idx] = plan.move_dst_slot(i);
    }
    // The view may have grown since (more tokens decoded); compare when the shapes agree.
    if (s.tiers.size() == plan.target_tiers().size()) {
      EXPECT_EQ(s.tiers, plan.target_tiers());
    }
  }

  absl::Status Heartbeat() {
    v1::HeartbeatRequest r = Signed(v1::HeartbeatRequest());
    r.set_daemon_epoch(resp_.daemon_epoch());
    return core_->Heartbeat(r).status();
  }

  std::map<uint64_t, Seq>& sequences() { return seqs_; }

 private:
  void Grow(Seq& s, uint32_t n) {
    if (n == s.num_pages) return;
    std::string tiers(size_t{groups_} * n, '\0');
    std::vector<uint64_t> slots(size_t{groups_} * n, 0);
    for (uint32_t g = 0; g < groups_; ++g) {
      for (uint32_t p = 0; p < s.num_pages; ++p) {
        tiers[size_t{g} * n + p] = s.tiers[size_t{g} * s.num_pages + p];
        slots[size_t{g} * n + p] = s.slots[size_t{g} * s.num_pages + p];
      }
    }
    s.tiers = std::move(tiers);
    s.slots = std::move(slots);
    s.num_pages = n;
  }

  DaemonCore* core_;
  uint32_t groups_;
  v1::RegisterWorkerResponse resp_;
  std::map<uint64_t, Seq> seqs_;
};

inline std::vector<float> RampScores(size_t n, uint32_t seed = 1) {
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<float>((i * 2654435761u + seed) % 1000);
  return s;
}

inline v1::PoolStatus PoolOf(DaemonCore* core, v1::PoolKind kind) {
  auto st = core->GetStatus(v1::GetStatusRequest());
  EXPECT_TRUE(st.ok());
  for (const auto& p : st->pools()) {
    if (p.kind() == kind) return p;
  }
  return {};
}

// The core's internal bookkeeping cross-check.
inline absl::Status CoreInvariants(DaemonCore* core) {
  return static_cast<internal::DaemonCoreImpl*>(core)->CheckInvariants();
}

}  // namespace kvtier::daemon::testing

#endif  // KVTIER_TESTS_UNIT_DAEMON_CORE_TEST_UTIL_H_
