#include "core/blocks/block_space.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kvtier::blocks {
namespace {

std::string Key(uint64_t i) {
  std::string k(8, '\0');
  std::memcpy(k.data(), &i, sizeof(i));
  return k;
}

TEST(BlockSpaceTest, AStoreIsVisibleOnlyOnceFinished) {
  BlockSpace s(4, nullptr);
  BlockTicket g = s.BeginStore(1, {Key(1)});
  ASSERT_EQ(g.slots.size(), 1u);
  ASSERT_GE(g.slots[0], 0);
  EXPECT_EQ(s.Acquire(2, {Key(1)}).slots[0], kMissing);
  EXPECT_EQ(s.BeginStore(2, {Key(1)}).slots[0], kPresent);  // being written: skip
  ASSERT_TRUE(s.FinishStore(1, g.ticket, true).ok());
  BlockTicket l = s.Acquire(2, {Key(1)});
  EXPECT_EQ(l.slots[0], g.slots[0]);
  EXPECT_TRUE(s.Release(2, l.ticket).ok());
}

TEST(BlockSpaceTest, AnAbortedOrDroppedStoreLeavesNothing) {
  BlockSpace s(2, nullptr);
  BlockTicket a = s.BeginStore(1, {Key(1)});
  ASSERT_TRUE(s.FinishStore(1, a.ticket, false).ok());
  BlockTicket b = s.BeginStore(7, {Key(2), Key(3)});
  s.DropOwner(7);
  EXPECT_EQ(s.Acquire(2, {Key(1), Key(2), Key(3)}).slots, std::vector<int64_t>(3, kMissing));
  EXPECT_EQ(s.stats().pending, 0u);
  // Both slots are free again.
  BlockTicket c = s.BeginStore(1, {Key(4), Key(5)});
  EXPECT_GE(c.slots[0], 0);
  EXPECT_GE(c.slots[1], 0);
  EXPECT_FALSE(s.FinishStore(7, b.ticket, true).ok());
}

TEST(BlockSpaceTest, ATicketBelongsToItsOwner) {
  BlockSpace s(2, nullptr);
  BlockTicket a = s.BeginStore(1, {Key(1)});
  EXPECT_EQ(s.FinishStore(2, a.ticket, true).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(s.FinishStore(1, a.ticket, true).ok());
  BlockTicket l = s.Acquire(1, {Key(1)});
  EXPECT_EQ(s.Release(2, l.ticket).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(s.FinishStore(1, l.ticket, true).ok());  // a lease is no store ticket
}

TEST(BlockSpaceTest, EvictsLeastRecentlyUsedButNeverALeasedBlock) {
  BlockSpace s(2, nullptr);
  for (uint64_t k : {1, 2}) {
    BlockTicket g = s.BeginStore(1, {Key(k)});
    ASSERT_TRUE(s.FinishStore(1, g.ticket, true).ok());
  }
  BlockTicket lease = s.Acquire(9, {Key(1)});  // 1 is now the most recent, and leased
  BlockTicket g3 = s.BeginStore(1, {Key(3)});  // evicts 2
  ASSERT_GE(g3.slots[0], 0);
  ASSERT_TRUE(s.FinishStore(1, g3.ticket, true).ok());
  EXPECT_EQ(s.Acquire(5, {Key(2)}).slots[0], kMissing);
  BlockTicket l3 = s.Acquire(5, {Key(3)});  // 3 leased too: nothing can go
  EXPECT_EQ(s.BeginStore(1, {Key(4)}).slots[0], kNoRoom);
  EXPECT_EQ(s.stats().stores_no_room, 1u);
  s.DropOwner(9);  // the reader of 1 died: 1 can go now, 3 is still read
  BlockTicket g4 = s.BeginStore(1, {Key(4)});
  EXPECT_EQ(g4.slots[0], lease.slots[0]);
  EXPECT_EQ(s.Acquire(6, {Key(3)}).slots[0], l3.slots[0]);
}

// Random operations against a model: a published key is found at its slot until evicted; no
// slot is ever held by two keys; a leased key is never evicted; pending keys are never found.
TEST(BlockSpaceTest, RandomOperationsKeepTheInvariants) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t slots = 1 + rng() % 16;
    const BlockTableHeader h = NewBlockTableHeader(slots, 8, 64);
    std::vector<uint8_t> memory(BlockTableBytes(h.buckets), 0);
    BlockTableWriter writer(memory.data(), h);
    BlockTableReader reader(memory.data(), memory.size());
    BlockSpace s(slots, &writer);
    struct Open {
      OwnerId owner;
      bool store;
      std::vector<std::string> keys;
      std::vector<int64_t> slots;
    };
    std::map<uint64_t, Open> open;
    std::map<std::string, int> readers;
    for (int step = 0; step < 3000; ++step) {
      const OwnerId owner = 1 + rng() % 4;
      std::vector<std::string> keys;
      for (int i = 0, n = 1 + rng() % 4; i < n; ++i) keys.push_back(Key(rng() % 24));
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      switch (rng() % 5) {
        case 0: {
          BlockTicket g = s.BeginStore(owner, keys);
          for (size_t i = 0; i < keys.size(); ++i) {
            // A key someone reads is stored: never granted again.
            if (readers[keys[i]] > 0) {
              ASSERT_EQ(g.slots[i], kPresent);
            }
          }
          if (g.ticket != 0) open[g.ticket] = {owner, true, keys, g.slots};
          break;
        }
        case 1: {
          BlockTicket l = s.Acquire(owner, keys);
          for (size_t i = 0; i < keys.size(); ++i) {
            BlockTableHit hit;
            if (l.slots[i] >= 0) {
              ++readers[keys[i]];
              if (reader.Find(keys[i], &hit)) {
                ASSERT_EQ(static_cast<int64_t>(hit.slot), l.slots[i]);
              }
            }
          }
          if (l.ticket != 0) open[l.ticket] = {owner, false, keys, l.slots};
          break;
        }
        case 2:
        case 3: {
          if (open.empty()) break;
          auto it = open.begin();
          std::advance(it, rng() % open.size());
          const Open o = it->second;
          if (o.store) {
            ASSERT_TRUE(s.FinishStore(o.owner, it->first, rng() % 4 != 0).ok());
          } else {
            ASSERT_TRUE(s.Release(o.owner, it->first).ok());
            for (size_t i = 0; i < o.keys.size(); ++i) {
              if (o.slots[i] >= 0) --readers[o.keys[i]];
            }
          }
          open.erase(it);
          break;
        }
        case 4: {
          if (rng() % 8 != 0) break;
          s.DropOwner(owner);
          for (auto it = open.begin(); it != open.end();) {
            if (it->second.owner != owner) {
              ++it;
              continue;
            }
            if (!it->second.store) {
              for (size_t i = 0; i < it->second.keys.size(); ++i) {
                if (it->second.slots[i] >= 0) --readers[it->second.keys[i]];
              }
            }
            it = open.erase(it);
          }
          break;
        }
      }
      // No slot in two live grants or leases of different keys.
      std::map<int64_t, std::string> holder;
      for (const auto& [id, o] : open) {
        for (size_t i = 0; i < o.keys.size(); ++i) {
          if (o.slots[i] < 0) continue;
          auto [at, fresh] = holder.emplace(o.slots[i], o.keys[i]);
          ASSERT_TRUE(fresh || at->second == o.keys[i]) << "seed " << seed << " step " << step;
        }
      }
      const BlockSpaceStats st = s.stats();
      ASSERT_LE(st.published + st.pending, slots);
    }
  }
}

}  // namespace
}  // namespace kvtier::blocks
