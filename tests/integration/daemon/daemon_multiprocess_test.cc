// Worker processes (fork, no gRPC) map their own extents from the descriptors the core hands
// out, write pages into the slots granted by plans, and read them back after later plans: the
// memory is really shared with the worker's process, grants of concurrent workers never
// collide, and a worker that dies without a word gets all its slots back to the budget once its
// lease expires.

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/layout/shm_abi.h"
#include "daemon/daemon_core.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

constexpr uint64_t kT1 = 8192, kT2 = 2560;

v1::RegisterWorkerRequest Worker(int i) {
  v1::RegisterWorkerRequest r;
  r.set_worker_name("proc");
  r.set_pid(1000 + i);
  auto* g = r.mutable_geometry();
  g->set_num_layers(4);
  g->set_num_kv_heads(2);
  g->set_head_dim(16);
  g->set_element_bytes(2);
  g->set_page_tokens(16);
  g->set_layer_groups(1);
  r.set_t1_page_bytes(kT1);
  r.set_t2_page_bytes(kT2);
  return r;
}

// The byte every position of a page holds: depends on worker, page and tier.
uint8_t Pattern(uint64_t worker, uint32_t page, int tier) {
  return static_cast<uint8_t>((worker * 131 + page * 7 + tier * 29) % 251 + 1);
}

struct Proc {
  uint64_t worker_id = 0;
  std::string secret;
  uint64_t seq = 0;
  v1::RegisterWorkerResponse reg;
  std::string tiers;
  std::vector<uint64_t> slots;
  uint64_t last_plan = 0;
};

// Runs `body` in a child process; returns its exit status (0 = success).
template <typename F>
int InChild(F body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// What a worker's plan executor does with the pools (child side): map both pools, check the
// source copies, write the destinations. Exit codes name the failure.
// Maps a pool's extents back to back, as the client library does (child side).
uint8_t* MapExtents(const v1::PoolDescriptor& d, const std::vector<edge::UniqueFd>& fds) {
  void* base = mmap(nullptr, d.size_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  for (size_t i = 1; i < fds.size(); ++i) {  // [0] is the header
    void* at = static_cast<uint8_t*>(base) + (i - 1) * d.extent_bytes();
    if (mmap(at, d.extent_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fds[i].get(),
             0) == MAP_FAILED) {
      return nullptr;
    }
  }
  return static_cast<uint8_t*>(base);
}

struct Fds {
  std::vector<edge::UniqueFd> ddr, cmp;
};

int ExecutePlan(const Proc& p, const v1::TierPlan& plan, const Fds& fds) {
  uint8_t* ddr = MapExtents(p.reg.pools(0), fds.ddr);
  uint8_t* cmp = MapExtents(p.reg.pools(1), fds.cmp);
  if (ddr == nullptr || cmp == nullptr) return 2;
  layout::PoolHeader header;
  if (pread(fds.ddr[0].get(), &header, sizeof(header), 0) != sizeof(header)) return 3;
  if (header.daemon_epoch != p.reg.daemon_epoch() || header.worker_id != p.worker_id) return 3;
  for (int i = 0; i < plan.move_group_size(); ++i) {
    const int from = plan.move_from()[i], to = plan.move_to()[i];
    const uint32_t page = plan.move_page(i);
    if (from == 1 || from == 2) {
      const uint8_t* src = (from == 1 ? ddr : cmp) + plan.move_src_slot(i);
      const uint64_t n = from == 1 ? kT1 : kT2;
      for (uint64_t b = 0; b < n; ++b) {
        if (src[b] != Pattern(p.worker_id, page, from)) return 4;  // source copy damaged
      }
    }
    if (to == 1 || to == 2) {
      uint8_t* dst = (to == 1 ? ddr : cmp) + plan.move_dst_slot(i);
      std::memset(dst, Pattern(p.worker_id, page, to), to == 1 ? kT1 : kT2);
    }
  }
  return 0;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoreOptions o;
    o.ddr_pool_bytes = 16ull << 20;
    o.compressed_pool_bytes = 8ull << 20;
    o.shm_prefix = "/kvtier-itest";
    auto c = DaemonCore::Create(o, &clock_, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = std::move(*c);
  }

  Proc Start(int i) {
    Proc p;
    const edge::PeerCredentials self{getuid(), getgid(), getpid(), {}};
    v1::RegisterWorkerRequest request = Worker(i);
    request.set_channel_ticket(core_->Hello(self)->ticket());
    auto reg = core_->RegisterWorker(request);
    EXPECT_TRUE(reg.ok()) << reg.status();
    p.reg = *reg;
    p.worker_id = reg->worker_id();
    p.secret = reg->session_secret();
    v1::OpenSequenceRequest open;
    open.set_worker_id(p.worker_id);
    open.set_session_secret(p.secret);
    open.set_prompt_tokens(32);
    auto* pol = open.mutable_policy();
    pol->set_name("hierarchy");
    pol->set_hbm_ratio(0.2);
    pol->set_compress_ratio(0.3);
    pol->set_protect_prompt(true);
    pol->set_window_tokens(64);
    p.seq = core_->OpenSequence(open)->sequence_id();
    return p;
  }

  v1::TierPlan Snapshot(Proc& p, uint64_t length, uint32_t seed) {
    const uint32_t n = static_cast<uint32_t>((length + 15) / 16);
    p.tiers.resize(n, '\0');
    p.slots.resize(n, 0);
    v1::SubmitSnapshotRequest r;
    r.set_worker_id(p.worker_id);
    r.set_session_secret(p.secret);
    r.set_sequence_id(p.seq);
    r.set_length(length);
    r.set_num_pages(n);
    for (uint32_t i = 0; i < n; ++i) r.add_page_scores(static_cast<float>((i * 37 + seed) % 101));
    r.set_current_tiers(p.tiers);
    r.set_last_plan_version(p.last_plan);
    auto plan = core_->SubmitSnapshot(r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }

  void Ack(Proc& p, const v1::TierPlan& plan) {
    v1::AckPlanRequest a;
    a.set_worker_id(p.worker_id);
    a.set_session_secret(p.secret);
    a.set_sequence_id(p.seq);
    a.set_plan_version(plan.plan_version());
    a.set_applied(true);
    ASSERT_TRUE(core_->AckPlan(a).ok());
    p.tiers = plan.target_tiers();
    p.last_plan = plan.plan_version();
  }

  // The worker's descriptors, as the memory channel would pass them (fork inherits them).
  Fds Fetch(const Proc& p) {
    Fds fds;
    const edge::PeerCredentials self{getuid(), getgid(), getpid(), {}};
    for (auto [kind, out] :
         {std::pair{v1::POOL_KIND_DDR, &fds.ddr}, std::pair{v1::POOL_KIND_COMPRESSED, &fds.cmp}}) {
      v1::FetchExtents f;
      f.set_worker_id(p.worker_id);
      f.set_session_secret(p.secret);
      f.set_kind(kind);
      auto reply = core_->FetchExtents(self, f, out);
      EXPECT_TRUE(reply.ok()) << reply.status();
    }
    return fds;
  }

  int Execute(const Proc& p, const v1::TierPlan& plan) {
    Fds fds = Fetch(p);
    return InChild([&] { return ExecutePlan(p, plan, fds); });
  }

  uint64_t DdrUsed() {
    auto st = core_->GetStatus(v1::GetStatusRequest());
    return st->pools(0).used_bytes();
  }

  FakeClock clock_;
  std::unique_ptr<DaemonCore> core_;
};

TEST_F(MultiProcessTest, WorkersShareThePoolsWithoutCollisions) {
  std::vector<Proc> procs = {Start(0), Start(1), Start(2)};
  uint64_t length = 1024;
  for (int round = 0; round < 4; ++round, length += 160) {
    std::vector<v1::TierPlan> plans;
    for (Proc& p : procs) plans.push_back(Snapshot(p, length, round * 13 + p.worker_id % 7));
    // All executors run at once, in their own processes.
    std::vector<pid_t> pids;
    std::vector<Fds> fds;
    for (const Proc& p : procs) fds.push_back(Fetch(p));
    for (size_t i = 0; i < procs.size(); ++i) {
      pid_t pid = fork();
      if (pid == 0) _exit(ExecutePlan(procs[i], plans[i], fds[i]));
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_EQ(WEXITSTATUS(status), 0) << "round " << round;
    }
    for (size_t i = 0; i < procs.size(); ++i) Ack(procs[i], plans[i]);
  }
  // A final read-only pass from another process: every page in T1/T2 still holds its pattern,
  // so no two workers were ever granted overlapping slots.
  int verified = 0;
  for (Proc& p : procs) {
    v1::TierPlan check = Snapshot(p, length, 999);
    for (int i = 0; i < check.move_group_size(); ++i) {
      verified += check.move_from()[i] == 1 || check.move_from()[i] == 2;
    }
    // Promote everything that moved: the executor verifies each source copy.
    EXPECT_EQ(Execute(p, check), 0);
    Ack(p, check);
  }
  EXPECT_GT(verified, 20) << "too few source copies checked to mean anything";
}

TEST_F(MultiProcessTest, DeadWorkerSlotsReturnAfterLeaseExpiry) {
  Proc survivor = Start(0);
  Proc victim = Start(1);
  v1::TierPlan ps = Snapshot(survivor, 1600, 1);
  v1::TierPlan pv = Snapshot(victim, 1600, 2);
  ASSERT_EQ(Execute(survivor, ps), 0);
  Ack(survivor, ps);
  // The victim dies mid-plan: SIGKILL after writing, before acknowledging.
  Fds victim_fds = Fetch(victim);
  EXPECT_EQ(InChild([&] {
              ExecutePlan(victim, pv, victim_fds);
              raise(SIGKILL);
              return 0;
            }),
            100 + SIGKILL);
  const uint64_t before = DdrUsed();
  v1::HeartbeatRequest hb;
  hb.set_worker_id(survivor.worker_id);
  hb.set_session_secret(survivor.secret);
  hb.set_daemon_epoch(survivor.reg.daemon_epoch());
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(core_->Heartbeat(hb).ok());
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(core_->ReapExpired(), 1);
  EXPECT_LT(DdrUsed(), before);
  // What is left is exactly the survivor's T1 pages.
  uint64_t t1 = 0;
  for (char c : survivor.tiers) t1 += c == 1;
  EXPECT_EQ(DdrUsed(), t1 * kT1);
  // And the survivor's data is intact.
  v1::TierPlan next = Snapshot(survivor, 1700, 50);
  EXPECT_EQ(Execute(survivor, next), 0);
}

}  // namespace
}  // namespace kvtier::daemon
