// The daemon's block store (daemon/block_index.h) through its channel requests: domains by uid,
// owners by process (a real child process that dies), the descriptors it hands out, bad input.

#include "daemon/block_index.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/metrics.h"

namespace kvtier::daemon {
namespace {

edge::PeerCredentials Peer(uid_t uid, pid_t pid = getpid()) {
  edge::PeerCredentials p;
  p.uid = uid;
  p.pid = pid;
  p.process = *edge::PeerProcess::OfPid(pid);
  return p;
}

BlockIndex MakeIndex(std::vector<uint32_t> shared = {}, uint64_t budget = 64ull << 20,
                     Metrics* metrics = nullptr) {
  BlockOptions o;
  o.budget_bytes = budget;
  o.space_bytes = 1 << 20;
  o.shared_uids = std::move(shared);
  return BlockIndex(o, "kvtier-test", 7, metrics, [](const edge::PeerCredentials& p) {
    return p.uid == 666 ? absl::PermissionDeniedError("uid 666 may not register")
                        : absl::OkStatus();
  });
}

v1::ChannelRequest Open(const std::string& space, uint64_t block_bytes = 4096,
                        uint32_t key_bytes = 36) {
  v1::ChannelRequest r;
  r.mutable_block_open()->set_space(space);
  r.mutable_block_open()->set_block_bytes(block_bytes);
  r.mutable_block_open()->set_key_bytes(key_bytes);
  return r;
}

v1::ChannelRequest Keys(bool store, const std::string& space, std::vector<std::string> keys) {
  v1::ChannelRequest r;
  auto* m =
      store ? r.mutable_block_store()->mutable_keys() : r.mutable_block_acquire()->mutable_keys();
  if (store) {
    r.mutable_block_store()->set_space(space);
  } else {
    r.mutable_block_acquire()->set_space(space);
  }
  for (auto& k : keys) m->Add(std::move(k));
  return r;
}

v1::ChannelRequest Finish(const std::string& space, uint64_t ticket) {
  v1::ChannelRequest r;
  r.mutable_block_finish()->set_space(space);
  r.mutable_block_finish()->set_ticket(ticket);
  r.mutable_block_finish()->set_ok(true);
  return r;
}

const std::string kKey(36, 'k');

// Stores kKey in `space` as `peer` and returns the reply of the finish.
v1::BlockReply StoreKey(BlockIndex& index, const edge::PeerCredentials& peer,
                        const std::string& space) {
  std::vector<edge::UniqueFd> fds;
  EXPECT_TRUE(index.Handle(peer, Open(space), &fds).ok());
  auto grant = index.Handle(peer, Keys(true, space, {kKey}), &fds);
  EXPECT_TRUE(grant.ok()) << grant.status();
  auto done = index.Handle(peer, Finish(space, grant->block().ticket()), &fds);
  EXPECT_TRUE(done.ok()) << done.status();
  return done->block();
}

int64_t AcquireKey(BlockIndex& index, const edge::PeerCredentials& peer, const std::string& space) {
  std::vector<edge::UniqueFd> fds;
  EXPECT_TRUE(index.Handle(peer, Open(space), &fds).ok());
  auto lease = index.Handle(peer, Keys(false, space, {kKey}), &fds);
  EXPECT_TRUE(lease.ok()) << lease.status();
  return lease->block().slots(0);
}

// One series of the registry: `name`{domain=`domain`}, or the unlabelled one.
double Series(Metrics& metrics, const std::string& name, const std::string& domain = "") {
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      const bool match =
          domain.empty() ? m.label.empty() : m.label.size() == 1 && m.label[0].value == domain;
      if (!match) continue;
      return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  ADD_FAILURE() << "no series " << name << "{domain=\"" << domain << "\"}";
  return -1;
}

std::string NumberedKey(int i) {
  std::string key(36, 'n');
  key.replace(0, std::to_string(i).size(), std::to_string(i));
  return key;
}

TEST(BlockIndexTest, BlocksDoNotCrossUidsByDefault) {
  BlockIndex index = MakeIndex();
  EXPECT_EQ(StoreKey(index, Peer(1000), "m").domain(), "uid:1000");
  EXPECT_GE(AcquireKey(index, Peer(1000), "m"), 0);
  EXPECT_EQ(AcquireKey(index, Peer(2000), "m"), blocks::kMissing);
  EXPECT_EQ(AcquireKey(index, Peer(1000), "other model"), blocks::kMissing);
}

TEST(BlockIndexTest, SharedUidsShareOneDomain) {
  BlockIndex index = MakeIndex({1000, 2000});
  EXPECT_EQ(StoreKey(index, Peer(1000), "m").domain(), "shared");
  EXPECT_GE(AcquireKey(index, Peer(2000), "m"), 0);
  EXPECT_EQ(AcquireKey(index, Peer(3000), "m"), blocks::kMissing);
}

TEST(BlockIndexTest, HandsOutAReadOnlyTableAndAWritableArena) {
  BlockIndex index = MakeIndex();
  std::vector<edge::UniqueFd> fds;
  auto reply = index.Handle(Peer(1000), Open("m"), &fds);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(fds.size(), 2u);
  const uint64_t table_bytes = reply->block().table_bytes();
  EXPECT_EQ(mmap(nullptr, table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0),
            MAP_FAILED);
  void* table = mmap(nullptr, table_bytes, PROT_READ, MAP_SHARED, fds[0].get(), 0);
  ASSERT_NE(table, MAP_FAILED);
  blocks::BlockTableReader reader(static_cast<const uint8_t*>(table), table_bytes);
  ASSERT_TRUE(reader.valid());
  EXPECT_EQ(reader.header()->block_slots, reply->block().block_slots());
  blocks::BlockTableHit hit;
  EXPECT_FALSE(reader.Find(kKey, &hit));
  StoreKey(index, Peer(1000), "m");
  ASSERT_TRUE(reader.Find(kKey, &hit));  // the daemon's write, seen through the read-only map
  const uint64_t arena_bytes = reply->block().block_slots() * reply->block().block_bytes();
  void* arena = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1].get(), 0);
  EXPECT_NE(arena, MAP_FAILED);
  munmap(arena, arena_bytes);
  munmap(table, table_bytes);
}

TEST(BlockIndexTest, WhatADeadProcessHeldGoesWithIt) {
  std::unique_ptr<Metrics> metrics = Metrics::Create();
  BlockIndex index = MakeIndex({}, 64ull << 20, metrics.get());
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const edge::PeerCredentials writer = Peer(1000, child);
  std::vector<edge::UniqueFd> fds;
  ASSERT_TRUE(index.Handle(writer, Open("m"), &fds).ok());
  auto grant = index.Handle(writer, Keys(true, "m", {kKey}), &fds);
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->block().pending(), 1u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(index.ReapExited(), 1);
  EXPECT_EQ(Series(*metrics, "kvtier_blocks_owners_reaped_total"), 1);
  EXPECT_EQ(AcquireKey(index, Peer(1000), "m"), blocks::kMissing);
  auto again = index.Handle(Peer(1000), Keys(true, "m", {kKey}), &fds);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->block().pending(), 1u);  // the dead writer's slot is not counted any more
  EXPECT_EQ(again->block().owners_dropped(), 1u);
}

TEST(BlockIndexTest, StoresLeasesAndEvictionsMoveTheMetrics) {
  std::unique_ptr<Metrics> metrics = Metrics::Create();
  BlockIndex index = MakeIndex({2000}, 64ull << 20, metrics.get());
  auto value = [&](const std::string& name, const std::string& domain = "private") {
    return Series(*metrics, name, domain);
  };
  const edge::PeerCredentials peer = Peer(1000);
  std::vector<edge::UniqueFd> fds;
  constexpr int kSlots = 16;
  constexpr double kBlock = 4096;
  v1::ChannelRequest open = Open("m");
  open.mutable_block_open()->set_want_bytes(kSlots * 4096);
  ASSERT_TRUE(index.Handle(peer, open, &fds).ok());
  EXPECT_EQ(value("kvtier_blocks_capacity_bytes"), kSlots * kBlock);
  EXPECT_EQ(value("kvtier_blocks_held_bytes"), 0);
  EXPECT_EQ(value("kvtier_blocks_capacity_bytes", "shared"), 0);

  std::vector<std::string> keys;
  for (int i = 0; i < kSlots; ++i) keys.push_back(NumberedKey(i));
  auto grant = index.Handle(peer, Keys(true, "m", keys), &fds);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(value("kvtier_blocks_stored_total"), 0);  // pending: not stored until finished
  ASSERT_TRUE(index.Handle(peer, Finish("m", grant->block().ticket()), &fds).ok());
  EXPECT_EQ(value("kvtier_blocks_stored_total"), kSlots);
  EXPECT_EQ(value("kvtier_blocks_held_bytes"), kSlots * kBlock);

  std::vector<std::string> wanted = keys;
  wanted.push_back(NumberedKey(99));
  auto lease = index.Handle(peer, Keys(false, "m", wanted), &fds);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(value("kvtier_blocks_hits_total"), kSlots);
  EXPECT_EQ(value("kvtier_blocks_misses_total"), 1);
  EXPECT_EQ(value("kvtier_blocks_leases"), 1);

  // Every slot leased: a store finds no room and is dropped; nothing read is evicted.
  auto full = index.Handle(peer, Keys(true, "m", {NumberedKey(kSlots)}), &fds);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->block().slots(0), blocks::kNoRoom);
  EXPECT_EQ(value("kvtier_blocks_dropped_total"), 1);
  EXPECT_EQ(value("kvtier_blocks_evicted_total"), 0);

  // Released: the next store evicts the least recently used block.
  v1::ChannelRequest release;
  release.mutable_block_release()->set_space("m");
  release.mutable_block_release()->set_ticket(lease->block().ticket());
  ASSERT_TRUE(index.Handle(peer, release, &fds).ok());
  EXPECT_EQ(value("kvtier_blocks_leases"), 0);
  auto room = index.Handle(peer, Keys(true, "m", {NumberedKey(kSlots)}), &fds);
  ASSERT_TRUE(room.ok()) << room.status();
  ASSERT_GE(room->block().slots(0), 0);
  EXPECT_EQ(value("kvtier_blocks_evicted_total"), 1);
  ASSERT_TRUE(index.Handle(peer, Finish("m", room->block().ticket()), &fds).ok());
  EXPECT_EQ(value("kvtier_blocks_stored_total"), kSlots + 1);
  EXPECT_EQ(value("kvtier_blocks_held_bytes"), kSlots * kBlock);

  // A shared uid's blocks count in the shared domain only.
  StoreKey(index, Peer(2000), "m");
  EXPECT_EQ(value("kvtier_blocks_stored_total", "shared"), 1);
  EXPECT_EQ(value("kvtier_blocks_stored_total"), kSlots + 1);
  EXPECT_EQ(value("kvtier_blocks_capacity_bytes", "shared"), (1 << 20));
}

TEST(BlockIndexTest, BadInputIsAClearError) {
  BlockIndex index = MakeIndex({}, 3ull << 20);
  std::vector<edge::UniqueFd> fds;
  auto code = [&](const edge::PeerCredentials& p, const v1::ChannelRequest& r) {
    return index.Handle(p, r, &fds).status();
  };
  EXPECT_EQ(code(Peer(666), Open("m")).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(code(Peer(1), Open("m", 1 << 20)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Peer(1), Open("m", 4096, 65)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Peer(1), Open("")).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(code(Peer(1), Open("m")).ok());
  EXPECT_EQ(code(Peer(1), Open("m", 8192)).code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = code(Peer(1), Keys(true, "m", {"short"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keys[0] has 5 bytes"), std::string::npos) << s;
  EXPECT_EQ(code(Peer(1), Keys(false, "never opened", {kKey})).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(Peer(1), Finish("m", 12345)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(code(Peer(1), Open("n")).ok());
  EXPECT_EQ(code(Peer(1), Open("o")).code(), absl::StatusCode::kResourceExhausted);
  BlockIndex off = MakeIndex({}, 0);
  EXPECT_EQ(off.Handle(Peer(1), Open("m"), &fds).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier::daemon
