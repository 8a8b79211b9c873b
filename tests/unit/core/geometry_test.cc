#include "core/layout/geometry.h"

#include <random>

#include "gtest/gtest.h"

namespace kvtier::layout {
namespace {

KvGeometry SmolLm2() {
  return KvGeometry{.num_layers = 30,
                    .num_kv_heads = 3,
                    .head_dim = 64,
                    .element_bytes = 2,
                    .page_tokens = 16,
                    .layer_groups = 1};
}

TEST(GeometryTest, BytesPerTokenMatchesSmolLm2Fp16) {
  // 30 layers x (K + V) x 3 heads x 64 dims x 2 bytes (REFERENCE.md: 23,040 B/token).
  EXPECT_EQ(SmolLm2().BytesPerToken(), 23040u);
  EXPECT_EQ(SmolLm2().PageBytes(0), 23040u * 16);
}

TEST(GeometryTest, PageMathRoundsUp) {
  KvGeometry g = SmolLm2();
  EXPECT_EQ(g.NumPages(0), 0u);
  EXPECT_EQ(g.NumPages(1), 1u);
  EXPECT_EQ(g.NumPages(16), 1u);
  EXPECT_EQ(g.NumPages(17), 2u);
  EXPECT_EQ(g.PageOf(31), 1u);
  EXPECT_EQ(g.PageBegin(2), 32u);
}

TEST(GeometryTest, ValidateNamesTheBadField) {
  KvGeometry g = SmolLm2();
  g.head_dim = 0;
  absl::Status s = g.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s;
  g = SmolLm2();
  g.layer_groups = 31;
  EXPECT_NE(g.Validate().message().find("layer_groups"), std::string::npos);
  g = SmolLm2();
  g.element_bytes = 3;
  EXPECT_NE(g.Validate().message().find("element_bytes"), std::string::npos);
  EXPECT_TRUE(SmolLm2().Validate().ok());
}

TEST(GeometryTest, LayerGroupsPartitionLayersForAnyShape) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    KvGeometry g = SmolLm2();
    g.num_layers = 1 + rng() % 80;
    g.layer_groups = 1 + rng() % g.num_layers;
    uint32_t covered = 0;
    for (uint32_t grp = 0; grp < g.layer_groups; ++grp) {
      ASSERT_EQ(g.GroupBegin(grp), covered);
      ASSERT_GE(g.LayersInGroup(grp), 1u);
      for (uint32_t l = g.GroupBegin(grp); l < g.GroupEnd(grp); ++l) {
        ASSERT_EQ(g.GroupOfLayer(l), grp)
            << "layers=" << g.num_layers << " groups=" << g.layer_groups;
      }
      covered = g.GroupEnd(grp);
    }
    ASSERT_EQ(covered, g.num_layers);
  }
}

}  // namespace
}  // namespace kvtier::layout
