// libFuzzer target over DaemonCore's request handling. Each input is a little program: a
// stream of operations (register, heartbeat, open, snapshot, ack, close, time, reap, status,
// reload) with fuzzed fields, driven against a fresh core with tiny real shm pools, so pool
// exhaustion, quotas and lease expiry are reached quickly. Snapshots are either built from the
// fuzzer's honest view of each sequence (then mutated) or taken raw from the input. After every
// operation the core's bookkeeping is cross-checked (DaemonCoreImpl::CheckInvariants); any
// mismatch, crash or sanitizer report is a finding.

#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "core/clock/clock.h"
#include "daemon/daemon_core.h"
#include "daemon/daemon_core_impl.h"

namespace {

using kvtier::FakeClock;
using namespace kvtier::daemon;  // NOLINT
namespace v1 = kvtier::v1;

struct SeqView {
  uint64_t worker = 0;
  uint64_t prompt = 0;
  uint64_t length = 0;
  uint32_t pages = 0;
  uint32_t groups = 1;
  uint32_t page_tokens = 16;
  std::string tiers;
  uint64_t last_plan = 0;
  bool inflight = false;
  v1::TierPlan plan;
};

struct WorkerView {
  uint64_t id = 0;
  uint64_t epoch = 0;
  uint32_t groups = 1;
  uint32_t page_tokens = 16;
};

v1::RegisterWorkerRequest FuzzRegister(FuzzedDataProvider& in) {
  v1::RegisterWorkerRequest r;
  r.set_worker_name(in.ConsumeRandomLengthString(8));
  r.set_pid(in.ConsumeIntegral<int32_t>());
  auto* g = r.mutable_geometry();
  const bool sane = in.ConsumeBool();
  g->set_num_layers(sane ? in.ConsumeIntegralInRange<uint32_t>(1, 8)
                         : in.ConsumeIntegral<uint32_t>());
  g->set_num_kv_heads(sane ? in.ConsumeIntegralInRange<uint32_t>(1, 4)
                           : in.ConsumeIntegral<uint32_t>());
  g->set_head_dim(sane ? in.ConsumeIntegralInRange<uint32_t>(1, 32)
                       : in.ConsumeIntegral<uint32_t>());
  g->set_element_bytes(in.ConsumeIntegralInRange<uint32_t>(0, 5));
  g->set_page_tokens(sane ? in.ConsumeIntegralInRange<uint32_t>(1, 32)
                          : in.ConsumeIntegral<uint32_t>());
  g->set_layer_groups(in.ConsumeIntegralInRange<uint32_t>(0, 4));
  // Mostly the exact page size; sometimes anything.
  uint64_t page = 2ull * g->page_tokens() * g->num_kv_heads() * g->head_dim() * g->element_bytes() *
                  std::max<uint32_t>(1, g->num_layers());
  r.set_t1_page_bytes(in.ConsumeBool() ? page : in.ConsumeIntegral<uint64_t>() % (1 << 20));
  r.set_t2_page_bytes(in.ConsumeBool() ? page / 2 + 1 : in.ConsumeIntegral<uint64_t>() % (1 << 20));
  return r;
}

v1::PolicyConfig FuzzPolicy(FuzzedDataProvider& in) {
  static const char* kNames[] = {"hierarchy", "full", "streaming", "h2o", "arkv", "", "bogus"};
  v1::PolicyConfig p;
  p.set_name(kNames[in.ConsumeIntegralInRange<int>(0, 6)]);
  auto ratio = [&] {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(0, 100) / 100.0
                            : in.ConsumeFloatingPoint<double>();
  };
  p.set_hbm_ratio(ratio());
  p.set_evict_ratio(ratio());
  p.set_compress_ratio(ratio());
  p.set_sink_tokens(in.ConsumeIntegralInRange<uint32_t>(0, 64));
  p.set_window_tokens(in.ConsumeIntegralInRange<uint32_t>(0, 256));
  p.set_protect_prompt(in.ConsumeBool());
  p.set_page_score_max(in.ConsumeBool());
  return p;
}

v1::SubmitSnapshotRequest HonestSnapshot(FuzzedDataProvider& in, uint64_t seq_id, SeqView& s) {
  uint64_t length = std::max(s.length, s.prompt) + in.ConsumeIntegralInRange<uint64_t>(0, 200);
  if (length == 0) length = 1;
  uint32_t pages = static_cast<uint32_t>((length + s.page_tokens - 1) / s.page_tokens);
  // Sometimes the snapshot carries the ack of the plan in flight: it then reports the plan's
  // target tiers, as a worker that applied it would.
  const bool carry = s.inflight && in.ConsumeBool();
  const std::string& known = carry ? s.plan.target_tiers() : s.tiers;
  std::string tiers(size_t{s.groups} * pages, '\0');
  for (uint32_t g = 0; g < s.groups; ++g) {
    for (uint32_t p = 0; p < s.pages && p < pages; ++p) {
      if (size_t{g} * s.pages + p < known.size()) {
        tiers[size_t{g} * pages + p] = known[size_t{g} * s.pages + p];
      }
    }
  }
  v1::SubmitSnapshotRequest r;
  r.set_worker_id(s.worker);
  r.set_sequence_id(seq_id);
  r.set_length(length);
  r.set_num_pages(pages);
  for (size_t i = 0; i < tiers.size(); ++i) {
    r.add_page_scores(static_cast<float>(in.ConsumeIntegralInRange<int>(0, 1000)));
  }
  r.set_current_tiers(tiers);
  r.set_last_plan_version(carry ? s.plan.plan_version() : s.last_plan);
  if (carry) r.set_applied_plan_version(s.plan.plan_version());
  // Occasional corruption of one field.
  switch (in.ConsumeIntegralInRange<int>(0, 13)) {
    case 0:
      r.set_num_pages(r.num_pages() + 1);
      break;
    case 1:
      if (r.page_scores_size() > 0) r.set_page_scores(0, NAN);
      break;
    case 2:
      if (!tiers.empty())
        (*r.mutable_current_tiers())[0] = static_cast<char>(in.ConsumeIntegral<uint8_t>());
      break;
    case 3:
      r.set_last_plan_version(in.ConsumeIntegral<uint64_t>());
      break;
    case 4:
      r.set_length(in.ConsumeIntegral<uint64_t>());
      break;
    case 5:
      r.set_applied_plan_version(in.ConsumeIntegralInRange<uint64_t>(0, 4));
      break;
    default:
      break;
  }
  return r;
}

// Successful operations by kind (register, heartbeat, open, snapshot, ack, close), printed at exit
// when KVTIER_FUZZ_STATS is set: shows the fuzzer gets past validation.
uint64_t g_ok[6];
void PrintStats() {
  std::fprintf(stderr, "ok: register %lu heartbeat %lu open %lu snapshot %lu ack %lu close %lu\n",
               g_ok[0], g_ok[1], g_ok[2], g_ok[3], g_ok[4], g_ok[5]);
}

void Check(DaemonCore* core) {
  absl::Status st = static_cast<internal::DaemonCoreImpl*>(core)->CheckInvariants();
  if (!st.ok()) {
    std::fprintf(stderr, "invariant broken: %s\n", std::string(st.message()).c_str());
    std::abort();
  }
}

}  // namespace

// Successful operations so far (the order of g_ok), for the replay test.
extern "C" void KvtierFuzzSuccesses(uint64_t out[6]) {
  for (int i = 0; i < 6; ++i) out[i] = g_ok[i];
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::getenv("KVTIER_FUZZ_STATS") != nullptr) std::atexit(PrintStats);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  FakeClock clock;
  CoreOptions o;
  o.ddr_pool_bytes = 256 << 10;
  o.compressed_pool_bytes = 128 << 10;
  o.shm_prefix = "/kvtier-fuzz";
  o.max_workers = 4;
  o.max_sequences_per_worker = 4;
  o.worker_ddr_quota_bytes = in.ConsumeBool() ? 64 << 10 : 0;
  auto created = DaemonCore::Create(o, &clock, nullptr);
  if (!created.ok()) std::abort();
  DaemonCore* core = created->get();
  std::vector<WorkerView> workers;
  std::map<uint64_t, SeqView> seqs;
  std::map<uint64_t, std::string> secrets;  // worker id -> session secret
  const kvtier::edge::PeerCredentials self{getuid(), getgid(), getpid(), {}};
  // Mostly the worker's own secret; sometimes none, a wrong one, or another worker's.
  auto secret_for = [&](uint64_t id) -> std::string {
    const int pick = in.ConsumeIntegralInRange<int>(0, 15);
    if (pick == 0) return "";
    if (pick == 1) return in.ConsumeBytesAsString(16);
    if (pick == 2 && !secrets.empty()) return secrets.begin()->second;
    auto it = secrets.find(id);
    return it == secrets.end() ? in.ConsumeBytesAsString(16) : it->second;
  };

  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    const int op = in.ConsumeIntegralInRange<int>(0, 9);
    auto pick_worker = [&]() -> uint64_t {
      if (workers.empty() || in.ConsumeIntegralInRange<int>(0, 7) == 0) {
        return in.ConsumeIntegral<uint64_t>();
      }
      return workers[in.ConsumeIntegralInRange<size_t>(0, workers.size() - 1)].id;
    };
    auto pick_seq = [&]() -> uint64_t {
      if (seqs.empty() || in.ConsumeIntegralInRange<int>(0, 7) == 0) {
        return in.ConsumeIntegral<uint64_t>();
      }
      auto it = seqs.begin();
      std::advance(it, in.ConsumeIntegralInRange<size_t>(0, seqs.size() - 1));
      return it->first;
    };
    switch (op) {
      case 0: {
        v1::RegisterWorkerRequest r = FuzzRegister(in);
        if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
          auto hello = core->Hello(self);
          if (!hello.ok()) std::abort();  // this process may always register
          r.set_channel_ticket(hello->ticket());
        } else {
          r.set_channel_ticket(in.ConsumeBytesAsString(16));
        }
        auto resp = core->RegisterWorker(r);
        if (resp.ok()) {
          ++g_ok[0];
          secrets[resp->worker_id()] = resp->session_secret();
          workers.push_back({resp->worker_id(), resp->daemon_epoch(), r.geometry().layer_groups(),
                             r.geometry().page_tokens()});
        }
        break;
      }
      case 1: {
        v1::HeartbeatRequest r;
        r.set_worker_id(pick_worker());
        r.set_daemon_epoch(workers.empty() || in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                                               : workers[0].epoch);
        r.set_session_secret(secret_for(r.worker_id()));
        if (core->Heartbeat(r).ok()) ++g_ok[1];
        break;
      }
      case 2: {
        v1::OpenSequenceRequest r;
        r.set_worker_id(pick_worker());
        r.set_session_secret(secret_for(r.worker_id()));
        r.set_prompt_tokens(in.ConsumeIntegralInRange<uint64_t>(0, 300));
        *r.mutable_policy() = FuzzPolicy(in);
        auto resp = core->OpenSequence(r);
        if (resp.ok()) {
          ++g_ok[2];
          SeqView s;
          s.worker = r.worker_id();
          s.prompt = r.prompt_tokens();
          for (const auto& w : workers) {
            if (w.id == s.worker) {
              s.groups = w.groups;
              s.page_tokens = w.page_tokens;
            }
          }
          seqs[resp->sequence_id()] = s;
        }
        break;
      }
      case 3: {
        uint64_t id = pick_seq();
        auto it = seqs.find(id);
        v1::SubmitSnapshotRequest r;
        if (it != seqs.end() && in.ConsumeIntegralInRange<int>(0, 5) != 0) {
          r = HonestSnapshot(in, id, it->second);
        } else {
          r.set_worker_id(pick_worker());
          r.set_sequence_id(id);
          r.set_length(in.ConsumeIntegralInRange<uint64_t>(0, 1 << 12));
          r.set_num_pages(in.ConsumeIntegralInRange<uint32_t>(0, 300));
          int n = in.ConsumeIntegralInRange<int>(0, 300);
          for (int i = 0; i < n; ++i) r.add_page_scores(in.ConsumeFloatingPoint<float>());
          r.set_current_tiers(in.ConsumeRandomLengthString(300));
          r.set_last_plan_version(in.ConsumeIntegralInRange<uint64_t>(0, 3));
        }
        r.set_session_secret(secret_for(r.worker_id()));
        auto plan = core->SubmitSnapshot(r);
        if (plan.ok()) ++g_ok[3];
        // A carried ack stands even when the snapshot is refused after it.
        if (it != seqs.end() && it->second.inflight && r.applied_plan_version() != 0 &&
            r.applied_plan_version() == it->second.plan.plan_version() &&
            r.worker_id() == it->second.worker && r.session_secret() == secrets[r.worker_id()] &&
            (plan.ok() ||
             plan.status().message().find("applied_plan_version") == std::string::npos)) {
          SeqView& s = it->second;
          s.inflight = false;
          s.last_plan = r.applied_plan_version();
          s.tiers = s.plan.target_tiers();
        }
        if (plan.ok() && it != seqs.end()) {
          SeqView& s = it->second;
          s.inflight = true;
          s.plan = *plan;
          // The worker's view grows with the snapshot it sent.
          uint32_t pages = r.num_pages();
          s.tiers = r.current_tiers();
          s.pages = pages;
          s.length = r.length();
        }
        break;
      }
      case 4: {
        uint64_t id = pick_seq();
        auto it = seqs.find(id);
        v1::AckPlanRequest r;
        r.set_worker_id(it != seqs.end() && in.ConsumeBool() ? it->second.worker : pick_worker());
        r.set_session_secret(secret_for(r.worker_id()));
        r.set_sequence_id(id);
        bool use_real = it != seqs.end() && it->second.inflight && in.ConsumeBool();
        r.set_plan_version(use_real ? it->second.plan.plan_version()
                                    : in.ConsumeIntegralInRange<uint64_t>(0, 4));
        r.set_applied(in.ConsumeBool());
        const bool acked = core->AckPlan(r).ok();
        if (acked) ++g_ok[4];
        // A replayed ack succeeds and changes nothing: only the plan in flight moves the view.
        if (acked && it != seqs.end() && it->second.inflight &&
            r.plan_version() == it->second.plan.plan_version()) {
          SeqView& s = it->second;
          s.inflight = false;
          s.last_plan = r.plan_version();
          if (r.applied()) s.tiers = s.plan.target_tiers();
        }
        break;
      }
      case 5: {
        v1::CloseSequenceRequest r;
        uint64_t id = pick_seq();
        auto it = seqs.find(id);
        r.set_worker_id(it != seqs.end() && in.ConsumeBool() ? it->second.worker : pick_worker());
        r.set_session_secret(secret_for(r.worker_id()));
        r.set_sequence_id(id);
        if (core->CloseSequence(r).ok()) {
          ++g_ok[5];
          seqs.erase(id);
        }
        break;
      }
      case 6:
        clock.Advance(absl::Milliseconds(in.ConsumeIntegralInRange<int>(0, 12000)));
        break;
      case 7:
        (void)core->ReapExpired();    // sequences of reaped workers now fail, as they should
        core->PrepareSpareExtents();  // and spares are made outside the lock
        break;
      case 8: {
        v1::GetStatusRequest r;
        r.set_include_workers(in.ConsumeBool());
        r.set_include_sequences(in.ConsumeBool());
        (void)core->GetStatus(r);
        break;
      }
      case 9: {
        CoreOptions n = o;
        n.worker_ddr_quota_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 18);
        n.worker_compressed_quota_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 1 << 17);
        (void)core->Reload(n);
        break;
      }
    }
    Check(core);
  }
  return 0;
}
