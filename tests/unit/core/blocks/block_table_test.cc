#include "core/blocks/block_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::blocks {
namespace {

struct Table {
  explicit Table(uint64_t slots, uint32_t key_bytes = 36)
      : h(NewBlockTableHeader(slots, key_bytes, 4096)) {
    memory.assign(BlockTableBytes(h.buckets), 0);
    writer = BlockTableWriter(memory.data(), h);
    reader = BlockTableReader(memory.data(), memory.size());
  }
  BlockTableHeader h{};
  std::vector<uint8_t> memory;
  BlockTableWriter writer;
  BlockTableReader reader;
};

std::string Key(uint64_t i, size_t n = 36) {
  std::string k(n, '\0');
  std::memcpy(k.data(), &i, sizeof(i));
  k[n - 1] = static_cast<char>(i * 7);
  return k;
}

TEST(BlockTableTest, FindsWhatWasPublishedAndNotWhatWasCleared) {
  Table t(64);
  ASSERT_TRUE(t.reader.valid());
  uint64_t dropped;
  const uint64_t index = t.writer.Publish(Key(1), 5, 11, &dropped);
  BlockTableHit hit;
  ASSERT_TRUE(t.reader.Find(Key(1), &hit));
  EXPECT_EQ(hit.slot, 5u);
  EXPECT_EQ(hit.generation, 11u);
  EXPECT_FALSE(t.reader.Find(Key(2), &hit));
  t.writer.Clear(index, 99);  // another publication's generation: stays
  EXPECT_TRUE(t.reader.Find(Key(1), &hit));
  t.writer.Clear(index, 11);
  EXPECT_FALSE(t.reader.Find(Key(1), &hit));
}

TEST(BlockTableTest, MissesAKeyOfTheWrongSize) {
  Table t(64);
  uint64_t dropped;
  t.writer.Publish(Key(1), 5, 1, &dropped);
  BlockTableHit hit;
  EXPECT_FALSE(t.reader.Find(Key(1, 32), &hit));
  EXPECT_FALSE(t.reader.Find(std::string(100, 'x'), &hit));
}

TEST(BlockTableTest, RefusesAMappingThatIsNotATable) {
  std::vector<uint8_t> junk(8192, 0xAB);
  EXPECT_FALSE(BlockTableReader(junk.data(), junk.size()).valid());
  Table t(64);
  EXPECT_FALSE(BlockTableReader(t.memory.data(), 100).valid());
}

// A reader racing the writer finds each key at the one slot it was published with, or misses;
// never a torn entry (the writer publishes key i at slot i % slots with generation i).
TEST(BlockTableTest, ConcurrentReadersNeverSeeATornEntry) {
  Table t(32);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, hits{0};
  std::thread reader([&] {
    std::mt19937_64 rng(1);
    while (!stop.load()) {
      const uint64_t i = rng() % 4096;
      BlockTableHit hit;
      if (t.reader.Find(Key(i), &hit)) {
        hits.fetch_add(1);
        if (hit.slot != i % 32 || hit.generation != i) wrong.fetch_add(1);
      }
    }
  });
  uint64_t dropped;
  for (int round = 0; round < 200; ++round) {
    for (uint64_t i = 0; i < 4096; ++i) t.writer.Publish(Key(i), i % 32, i, &dropped);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
}

}  // namespace
}  // namespace kvtier::blocks
