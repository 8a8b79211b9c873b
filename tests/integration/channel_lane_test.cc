// Heartbeats and snapshots on kept connections of the memory channel
// (daemon/kvtierd/channel_lane.h), against the real kvtierd: the lease lives on heartbeats there
// alone, snapshots get their plans there (or over gRPC when a plan is too large for the channel),
// and a connection that misbehaves (a secret that does not match, another request, a flood, a
// client that stops reading) is dropped alone while the other workers' requests go on being
// answered, and counted in kvtier_connections_dropped_total by what it did.

#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "edge/memory_channel.h"
#include "edge/message_limits.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/http_get.h"
#include "tests/integration/support/manual_session.h"

namespace kvtier::testing {
namespace {

constexpr int kTtlMs = 1000;

// A daemon with its metrics on `*metrics_port`.
std::unique_ptr<DaemonProcess> StartDaemon(int* metrics_port) {
  absl::StatusOr<int> port = FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status();
  *metrics_port = port.value_or(0);
  auto d = DaemonProcess::Start(
      {.config_text = absl::StrCat("[server]\nreap_interval_ms = 50\n[leases]\nttl_ms = ", kTtlMs,
                                   "\nheartbeat_ms = 300\n"),
       .metrics_address = absl::StrCat("127.0.0.1:", *metrics_port)});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// Connections dropped for `reason` (kvtier_connections_dropped_total), once at least `expected`.
double Dropped(int port, const std::string& reason, double expected) {
  return WaitForMetric(
      port, absl::StrCat("kvtier_connections_dropped_total{reason=\"", reason, "\"}"), expected);
}

// A worker registered by hand, so that the test holds its secret (the library keeps it private).
absl::StatusOr<ManualSession> Register(const DaemonProcess& d) {
  return RegisterByHand(d.address());
}

edge::UniqueFd Connect(const DaemonProcess& d) {
  auto fd = edge::ConnectChannel(edge::ChannelPathFor(d.socket_path()), absl::Seconds(2));
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *std::move(fd) : edge::UniqueFd();
}

absl::StatusOr<v1::ChannelReply> Beat(int fd, const v1::HeartbeatRequest& beat) {
  v1::ChannelRequest r;
  *r.mutable_heartbeat() = beat;
  return edge::ChannelExchange(fd, r, nullptr);
}

// True once the daemon has closed `fd`: a heartbeat on it gets no answer.
bool Closed(int fd, const v1::HeartbeatRequest& beat) {
  absl::StatusOr<v1::ChannelReply> r = Beat(fd, beat);
  return !r.ok() && r.status().code() == absl::StatusCode::kUnavailable;
}

TEST(HeartbeatLaneTest, AKeptConnectionAloneKeepsTheLease) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto s = Register(*d);
  ASSERT_TRUE(s.ok()) << s.status();
  edge::UniqueFd fd = Connect(*d);
  // Three lease TTLs on heartbeats over one connection, and no RPC at all.
  for (int i = 0; i < 30; ++i) {
    auto reply = Beat(fd.get(), s->Heartbeat());
    ASSERT_TRUE(reply.ok()) << "heartbeat " << i << ": " << reply.status();
    ASSERT_TRUE(reply->has_heartbeat());
    EXPECT_EQ(reply->heartbeat().lease_ttl_ms(), static_cast<uint64_t>(kTtlMs));
    absl::SleepFor(absl::Milliseconds(100));
  }
  grpc::ClientContext ctx;
  v1::HeartbeatResponse over_grpc;
  EXPECT_TRUE(s->stub->Heartbeat(&ctx, s->Heartbeat(), &over_grpc).ok()) << "the lease ran out";
  EXPECT_TRUE(d->WaitForLog(absl::StrCat("heartbeat lane: keeps a connection of pid ", getpid(),
                                         " (uid ", getuid(), "; 1 kept)")))
      << d->Log();
  EXPECT_EQ(ScrapeMetric(port, "kvtier_heartbeat_lane_connections"), 1);
  // The real-time priority as the log says it went (refused where RLIMIT_RTPRIO forbids it).
  const bool refused = d->Log().find("SCHED_FIFO priority 1 refused") != std::string::npos;
  EXPECT_EQ(ScrapeMetric(port, "kvtier_heartbeat_lane_realtime"), refused ? 0 : 1) << d->Log();
  // Once the lease is gone the daemon says so and closes the connection; the worker registers
  // again and connects anew.
  absl::SleepFor(absl::Milliseconds(kTtlMs + 300));
  auto gone = Beat(fd.get(), s->Heartbeat());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition) << gone.status();
  EXPECT_NE(gone.status().message().find("register again"), absl::string_view::npos);
  auto again = Register(*d);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(Closed(fd.get(), again->Heartbeat()));
  edge::UniqueFd fresh = Connect(*d);
  EXPECT_TRUE(Beat(fresh.get(), again->Heartbeat()).ok());
  // A heartbeat for a worker the daemon never had is answered, and its connection not kept.
  edge::UniqueFd stranger = Connect(*d);
  v1::HeartbeatRequest unknown = again->Heartbeat();
  unknown.set_worker_id(unknown.worker_id() + 1000);
  EXPECT_EQ(Beat(stranger.get(), unknown).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Closed(stranger.get(), again->Heartbeat()));
  // Both refusals counted, nothing else; only `fresh` is kept.
  EXPECT_EQ(Dropped(port, "heartbeat_refused", 2), 2);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_connections_dropped_total"), 2);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_heartbeat_lane_connections"), 1);
}

TEST(HeartbeatLaneTest, AConnectionThatMisbehavesIsDroppedAloneWithAClearAnswer) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto good = Register(*d);
  auto other = Register(*d);
  ASSERT_TRUE(good.ok() && other.ok());
  edge::UniqueFd kept = Connect(*d);
  ASSERT_TRUE(Beat(kept.get(), good->Heartbeat()).ok());

  // Another worker's secret: denied, not kept.
  {
    edge::UniqueFd fd = Connect(*d);
    v1::HeartbeatRequest stolen = other->Heartbeat();
    stolen.set_session_secret(good->reg.session_secret());
    auto r = Beat(fd.get(), stolen);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    EXPECT_NE(r.status().message().find("session_secret"), absl::string_view::npos);
    EXPECT_TRUE(Closed(fd.get(), other->Heartbeat()));
  }
  // Anything but a heartbeat on a kept connection.
  {
    edge::UniqueFd fd = Connect(*d);
    ASSERT_TRUE(Beat(fd.get(), other->Heartbeat()).ok());
    v1::ChannelRequest hello;
    hello.mutable_hello();
    auto r = edge::ChannelExchange(fd.get(), hello, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("heartbeats only"), absl::string_view::npos);
    EXPECT_TRUE(Closed(fd.get(), other->Heartbeat()));
  }
  // Heartbeats back to back, far above 1,000 a second: refused once the burst is spent.
  {
    edge::UniqueFd fd = Connect(*d);
    absl::Status last;
    int answered = 0;
    for (int i = 0; i < 2000 && last.ok(); ++i) {
      last = Beat(fd.get(), other->Heartbeat()).status();
      answered += last.ok();
    }
    EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
    EXPECT_NE(last.message().find("faster than 1000 a second"), absl::string_view::npos) << last;
    EXPECT_GE(answered, 32);  // the burst
    EXPECT_TRUE(Closed(fd.get(), other->Heartbeat()));
    EXPECT_TRUE(d->WaitForLog("too many heartbeats")) << d->Log();
  }
  // The well-behaved connection was answered throughout.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Beat(kept.get(), good->Heartbeat()).ok());
  // Each drop counted by what its peer did.
  EXPECT_EQ(Dropped(port, "heartbeat_refused", 1), 1);
  EXPECT_EQ(Dropped(port, "heartbeat_misuse", 1), 1);
  EXPECT_EQ(Dropped(port, "heartbeat_too_fast", 1), 1);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_connections_dropped_total"), 3);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_heartbeat_lane_connections"), 1);
}

TEST(HeartbeatLaneTest, AClientThatStopsReadingIsDropped) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto s = Register(*d);
  ASSERT_TRUE(s.ok()) << s.status();
  edge::UniqueFd fd = Connect(*d);
  ASSERT_TRUE(Beat(fd.get(), s->Heartbeat()).ok());
  // Heartbeats at 500 a second, within the rate, whose answers are never read: the daemon's
  // queue to this client fills and it lets the connection go.
  v1::ChannelRequest r;
  *r.mutable_heartbeat() = s->Heartbeat();
  int sent = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && edge::SendMessage(fd.get(), r, {}).ok()) {
    ++sent;
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_LT(absl::Now(), deadline) << "still served after " << sent << " unread answers";
  EXPECT_GT(sent, 10);
  EXPECT_TRUE(d->WaitForLog(
      absl::StrCat("heartbeat lane: dropped pid ", getpid(), ": its answer could not be sent")))
      << d->Log();
  EXPECT_EQ(Dropped(port, "heartbeat_unread", 1), 1);
  // The worker itself is fine: a new connection is kept again.
  edge::UniqueFd fresh = Connect(*d);
  EXPECT_TRUE(Beat(fresh.get(), s->Heartbeat()).ok());
  EXPECT_EQ(WaitForMetric(port, "kvtier_heartbeat_lane_connections", 1), 1);
}

// Threads of this process at SCHED_FIFO `priority` (from /proc: rt_priority is field 40 of a
// task's stat, the policy field 41).
int RealtimeThreads(int priority) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), {});
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
    if (f.size() > 38 && f[37] == absl::StrCat(priority) && f[38] == "1") ++n;
  }
  return n;
}

// Whether a thread of this process may take SCHED_FIFO `priority` (tried on a thread of its own).
bool MayRunRealtime(int priority) {
  bool allowed = false;
  std::thread probe([&] {
    sched_param param{};
    param.sched_priority = priority;
    allowed = pthread_setschedparam(pthread_self(), SCHED_FIFO, &param) == 0;
  });
  probe.join();
  return allowed;
}

// ClientOptions::heartbeat_priority: the client's own heartbeat thread at SCHED_FIFO, renewing
// the lease over the lane; a priority out of range is refused by name.
TEST(HeartbeatLaneTest, AWorkerHeartbeatsFromARealTimeThreadWhenAllowed) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  ClientOptions o;
  o.address = d->address();
  o.registration = SmallRegistration();
  o.registration.set_worker_name("realtime");
  o.heartbeat_priority = 100;
  auto bad = WorkerClient::Connect(o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("heartbeat_priority is 100"), absl::string_view::npos);

  ASSERT_EQ(RealtimeThreads(7), 0);
  o.heartbeat_priority = 7;
  auto client = WorkerClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  // Where this process may take the priority (CAP_SYS_NICE, or RLIMIT_RTPRIO >= 7) the client
  // took it for exactly one thread; where not, for none.
  EXPECT_EQ((*client)->heartbeat_realtime(), MayRunRealtime(7));
  EXPECT_EQ(RealtimeThreads(7), MayRunRealtime(7) ? 1 : 0);
  // Three lease TTLs on the background thread's heartbeats alone, over the lane.
  absl::SleepFor(absl::Milliseconds(3 * kTtlMs));
  EXPECT_TRUE((*client)->connected());
  EXPECT_EQ((*client)->generation(), 1u) << "the lease was lost and the worker registered again";
  EXPECT_TRUE(d->WaitForLog(absl::StrCat("heartbeat lane: keeps a connection of pid ", getpid())))
      << d->Log();
  client->reset();
  EXPECT_EQ(RealtimeThreads(7), 0);
}

// A small-page worker (2 KiB T1 pages), so that thousands of pages fit the test's pools.
v1::RegisterWorkerRequest SmallPages() {
  v1::RegisterWorkerRequest r;
  v1::ModelGeometry* g = r.mutable_geometry();
  g->set_num_layers(2);
  g->set_num_kv_heads(1);
  g->set_head_dim(16);
  g->set_element_bytes(2);
  g->set_page_tokens(16);
  g->set_layer_groups(1);
  r.set_t1_page_bytes(2048);
  r.set_t2_page_bytes(1024);
  return r;
}

// The library's client of a SmallPages() worker.
absl::StatusOr<std::unique_ptr<WorkerClient>> SmallPagesClient(const DaemonProcess& d) {
  ClientOptions o;
  o.address = d.address();
  o.registration = SmallPages();
  return WorkerClient::Connect(o);
}

// A first snapshot of `pages` pages, all in T0, scores rising with the position.
v1::SubmitSnapshotRequest FirstSnapshot(uint64_t sequence_id, uint32_t pages) {
  v1::SubmitSnapshotRequest s;
  s.set_sequence_id(sequence_id);
  s.set_length(uint64_t{pages} * 16);
  s.set_num_pages(pages);
  for (uint32_t p = 0; p < pages; ++p) s.add_page_scores(static_cast<float>(p % 97));
  s.set_current_tiers(std::string(pages, '\0'));
  return s;
}

v1::PolicyConfig Hierarchy(double hbm_ratio) {
  v1::PolicyConfig p;
  p.set_name("hierarchy");
  p.set_hbm_ratio(hbm_ratio);
  return p;
}

TEST(SnapshotLaneTest, SnapshotsGetTheirPlansOnAKeptConnectionAndMisuseDropsItAlone) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto good = Register(*d);
  auto other = Register(*d);
  ASSERT_TRUE(good.ok() && other.ok());
  auto open = [&](const ManualSession& s) {
    grpc::ClientContext ctx;
    v1::OpenSequenceRequest r;
    r.set_worker_id(s.reg.worker_id());
    r.set_session_secret(s.reg.session_secret());
    *r.mutable_policy() = Hierarchy(0.5);
    v1::OpenSequenceResponse out;
    EXPECT_TRUE(s.stub->OpenSequence(&ctx, r, &out).ok());
    return out.sequence_id();
  };
  auto signed_snapshot = [](const ManualSession& s, uint64_t seq, uint32_t pages) {
    v1::ChannelRequest r;
    *r.mutable_snapshot() = FirstSnapshot(seq, pages);
    r.mutable_snapshot()->set_worker_id(s.reg.worker_id());
    r.mutable_snapshot()->set_session_secret(s.reg.session_secret());
    return r;
  };
  const uint64_t seq = open(*good), other_seq = open(*other);
  edge::UniqueFd kept = Connect(*d);
  auto first = edge::ChannelExchange(kept.get(), signed_snapshot(*good, seq, 64), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_plan());
  EXPECT_EQ(first->plan().sequence_id(), seq);
  EXPECT_GT(first->plan().move_page_size(), 0);  // half the pages leave T0
  // The same snapshot again on the same connection: the plan in flight, unchanged.
  auto again = edge::ChannelExchange(kept.get(), signed_snapshot(*good, seq, 64), nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan().SerializeAsString(), first->plan().SerializeAsString());
  EXPECT_TRUE(d->WaitForLog("snapshot lane: keeps a connection")) << d->Log();

  // Another worker's sequence under this worker's secret: denied, not kept.
  {
    edge::UniqueFd fd = Connect(*d);
    v1::ChannelRequest stolen = signed_snapshot(*other, other_seq, 64);
    stolen.mutable_snapshot()->set_session_secret(good->reg.session_secret());
    auto r = edge::ChannelExchange(fd.get(), stolen, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    EXPECT_TRUE(Closed(fd.get(), other->Heartbeat()));
  }
  // A heartbeat on a kept snapshot connection.
  {
    edge::UniqueFd fd = Connect(*d);
    ASSERT_TRUE(
        edge::ChannelExchange(fd.get(), signed_snapshot(*other, other_seq, 32), nullptr).ok());
    auto r = Beat(fd.get(), other->Heartbeat());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("snapshots only"), absl::string_view::npos);
    EXPECT_TRUE(Closed(fd.get(), other->Heartbeat()));
  }
  // The well-behaved connection was answered throughout.
  EXPECT_TRUE(edge::ChannelExchange(kept.get(), signed_snapshot(*good, seq, 64), nullptr).ok());
  EXPECT_EQ(Dropped(port, "snapshot_refused", 1), 1);
  EXPECT_EQ(Dropped(port, "snapshot_misuse", 1), 1);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_connections_dropped_total"), 2);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_snapshot_lane_connections"), 1);
}

// The library sends snapshots over the channel; a plan too large for one datagram is refused
// there after it was recorded, and the client gets it over gRPC by sending the same snapshot
// again (the plan in flight); the next small snapshot goes over the channel again.
TEST(SnapshotLaneTest, TheClientTakesAPlanTooLargeForTheChannelOverGrpc) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto client = SmallPagesClient(*d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto seq = (*client)->OpenSequence(0, Hierarchy(0.1), "large");
  ASSERT_TRUE(seq.ok()) << seq.status();
  // 12,000 pages: the snapshot (about 60 KB) fits a datagram; its plan (about 10,800 moves) not.
  v1::SubmitSnapshotRequest large = FirstSnapshot(*seq, 12000);
  ASSERT_LT(large.ByteSizeLong() + 16, edge::kMaxChannelMessageBytes);
  auto plan = (*client)->SubmitSnapshot(large);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->ByteSizeLong(), edge::kMaxChannelMessageBytes);
  EXPECT_EQ(plan->target_tiers().size(), 12000u);
  EXPECT_EQ(Dropped(port, "snapshot_refused", 1), 1);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_rpc_requests_total{rpc=\"SubmitSnapshot\"}"), 2)
      << "once on the channel, once more (the replay) over gRPC";
  ASSERT_TRUE((*client)->AckPlan(*seq, plan->plan_version(), true, "").ok());

  auto small = (*client)->OpenSequence(0, Hierarchy(0.5), "small");
  ASSERT_TRUE(small.ok());
  auto next = (*client)->SubmitSnapshot(FirstSnapshot(*small, 64));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitForMetric(port, "kvtier_snapshot_lane_connections", 1), 1);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_rpc_requests_total{rpc=\"SubmitSnapshot\"}"), 3);
}

// Sequences of one client whose snapshots are in flight at once each take a kept connection, up
// to four; past that a snapshot goes over gRPC rather than wait for another's answer. Every
// snapshot gets its plan either way.
TEST(SnapshotLaneTest, ConcurrentSnapshotsOfOneClientShareAtMostFourConnections) {
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  auto client = SmallPagesClient(*d);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kThreads = 8, kEach = 40;
  std::vector<std::thread> threads;
  std::atomic<int> planned{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto seq = (*client)->OpenSequence(0, Hierarchy(0.5), "concurrent");
      if (!seq.ok()) return;
      for (int i = 0; i < kEach; ++i) {
        // The same first snapshot again: the plan in flight, so each answer is a whole plan.
        planned += (*client)->SubmitSnapshot(FirstSnapshot(*seq, 256)).ok();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(planned.load(), kThreads * kEach);
  const double kept = ScrapeMetric(port, "kvtier_snapshot_lane_connections");
  EXPECT_GE(kept, 1);
  EXPECT_LE(kept, 4);
  EXPECT_EQ(ScrapeMetric(port, "kvtier_rpc_requests_total{rpc=\"SubmitSnapshot\"}"),
            kThreads * kEach);
}

// The snapshot lane's real-time priority has a CPU budget: snapshots that keep its thread busy
// over half a core cost it the priority (the gauge and the log say so) while every one is still
// answered, and the first snapshot after a quiet window gives it back. Each snapshot here is a
// fresh decision over 8,000 pages (the previous plan abandoned), so four clients in a closed
// loop keep the lane's thread all but always busy.
TEST(SnapshotLaneTest, AFloodOfSnapshotsCostsTheLaneItsPriorityUntilItStops) {
  if (!MayRunRealtime(1)) GTEST_SKIP() << "this process may not take SCHED_FIFO (nor its kvtierd)";
  int port = 0;
  auto d = StartDaemon(&port);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->WaitForLog("snapshot lane: SCHED_FIFO priority 1")) << d->Log();
  auto client = SmallPagesClient(*d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto fresh = [](uint64_t seq) {
    v1::SubmitSnapshotRequest s = FirstSnapshot(seq, 8000);
    s.set_abandon_pending(true);  // a new decision, not the plan in flight again
    return s;
  };
  std::atomic<bool> stop{false};
  std::atomic<int> planned{0}, failed{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 4; ++t) {
    flood.emplace_back([&] {
      auto seq = (*client)->OpenSequence(0, Hierarchy(0.5), "flood");
      if (!seq.ok()) return;
      while (!stop) ((*client)->SubmitSnapshot(fresh(*seq)).ok() ? planned : failed) += 1;
    });
  }
  const bool given_up = d->WaitForLog("snapshot lane: snapshots took over 50% of a core");
  const double gauge_in_flood = ScrapeMetric(port, "kvtier_snapshot_lane_realtime");
  stop = true;
  for (std::thread& t : flood) t.join();
  EXPECT_TRUE(given_up) << d->Log();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(planned.load(), 0);
  EXPECT_EQ(gauge_in_flood, 0);  // still given up: every window of the flood was over budget

  // Quiet for two windows, then one snapshot: the priority is back.
  absl::SleepFor(absl::Milliseconds(300));
  auto seq = (*client)->OpenSequence(0, Hierarchy(0.5), "after");
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE((*client)->SubmitSnapshot(FirstSnapshot(*seq, 64)).ok());
  EXPECT_TRUE(d->WaitForLog("snapshot lane: back to SCHED_FIFO")) << d->Log();
  EXPECT_EQ(WaitForMetric(port, "kvtier_snapshot_lane_realtime", 1), 1);
}

}  // namespace
}  // namespace kvtier::testing
