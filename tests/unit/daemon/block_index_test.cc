// The daemon's block store (daemon/block_index.h) through its channel requests: domains by uid,
// owners by process (a real child process that dies), the descriptors it hands out, bad input.

#include "daemon/block_index.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kvtier::daemon {
namespace {

edge::PeerCredentials Peer(uid_t uid, pid_t pid = getpid()) {
  edge::PeerCredentials p;
  p.uid = uid;
  p.pid = pid;
  p.process = *edge::PeerProcess::OfPid(pid);
  return p;
}

BlockIndex MakeIndex(std::vector<uint32_t> shared = {}, uint64_t budget = 64ull << 20) {
  BlockOptions o;
  o.budget_bytes = budget;
  o.space_bytes = 1 << 20;
  o.shared_uids = std::move(shared);
  return BlockIndex(o, "kvtier-test", 7, [](const edge::PeerCredentials& p) {
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
  BlockIndex index = MakeIndex();
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
  EXPECT_EQ(AcquireKey(index, Peer(1000), "m"), blocks::kMissing);
  auto again = index.Handle(Peer(1000), Keys(true, "m", {kKey}), &fds);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->block().pending(), 1u);  // the dead writer's slot is not counted any more
  EXPECT_EQ(again->block().owners_dropped(), 1u);
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
