#include "core/tiering/rkv.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::tiering {
namespace {

using ::testing::HasSubstr;

// One layer, one head, `n` positions, keys one-hot (orthogonal, similarity 0) except the given
// duplicates, which share key e0; attention uniform unless given.
struct Case {
  uint64_t n;
  uint32_t dim;
  std::vector<float> keys;
  std::vector<float> attention;  // [queries][n]
  uint32_t queries;

  RkvInput Input() const {
    return RkvInput{.num_layers = 1,
                    .num_q_heads = 1,
                    .num_kv_heads = 1,
                    .head_dim = dim,
                    .prompt_tokens = 0,
                    .length = n,
                    .queries = queries,
                    .attention = attention,
                    .keys = keys};
  }
};

Case MakeCase(uint64_t n, uint32_t alpha, const std::vector<uint64_t>& duplicates) {
  Case c{.n = n,
         .dim = static_cast<uint32_t>(n + 1),
         .keys = {},
         .attention = {},
         .queries = static_cast<uint32_t>(std::min<uint64_t>(alpha, n))};
  c.keys.assign(n * c.dim, 0.0f);
  for (uint64_t i = 0; i < n; ++i) c.keys[i * c.dim + i + 1] = 1.0f;
  for (uint64_t i : duplicates) {
    std::fill_n(c.keys.begin() + i * c.dim, c.dim, 0.0f);
    c.keys[i * c.dim] = 1.0f;
  }
  c.attention.assign(uint64_t{c.queries} * n, 1.0f / n);
  return c;
}

std::vector<uint64_t> Evicted(const KeepMask& m) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < m.length; ++i) {
    if (!m.Kept(0, 0, i)) out.push_back(i);
  }
  return out;
}

// Six copies of one key among unique keys, uniform attention: R-KV evicts the redundant copies
// and keeps the most recent one.
TEST(RkvTest, EvictsRedundantCopiesAndKeepsTheMostRecent) {
  const Case c = MakeCase(20, 2, {0, 1, 2, 3, 4, 5});
  RkvConfig config;
  config.alpha = 2;
  config.budget_tokens = 15;
  auto kept = RkvCompress(c.Input(), KeepMask::AllKept(1, 1, c.n), config);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(Evicted(*kept), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
}

// λ = 1: importance alone. The max-pool (width 7) lifts the neighbours of a strongly attended
// position: positions within 3 of position 10 outrank the rest.
TEST(RkvTest, ImportanceIsMaxPooledAttentionOfTheLastQueries) {
  Case c = MakeCase(30, 8, {});
  for (uint32_t q = 0; q < c.queries; ++q) c.attention[q * c.n + 10] = 0.5f;
  RkvConfig config;
  config.lambda = 1.0;
  config.budget_tokens = 8 + 7;  // the window of 8 + seven pooled positions
  auto kept = RkvCompress(c.Input(), KeepMask::AllKept(1, 1, c.n), config);
  ASSERT_TRUE(kept.ok()) << kept.status();
  for (uint64_t i = 0; i < c.n; ++i) {
    const bool expect = (i >= 7 && i <= 13) || i >= 22;
    EXPECT_EQ(kept->Kept(0, 0, i), expect) << i;
  }
}

TEST(RkvTest, CompressesOnlyWhenDueAndBackToTheBudget) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  RkvConfig config;
  config.budget_tokens = 40;
  config.buffer_tokens = 16;
  const uint32_t layers = 2, q_heads = 2, kv_heads = 1, dim = 8;
  KeepMask mask = KeepMask::AllKept(layers, kv_heads, 0);
  int compressions = 0;
  for (uint64_t n = 1; n <= 120; ++n) {
    mask = mask.Extended(n);
    if (!RkvDue(mask, config)) continue;
    ++compressions;
    const uint32_t queries = static_cast<uint32_t>(std::min<uint64_t>(config.alpha, n));
    std::vector<float> attention(uint64_t{layers} * q_heads * queries * n),
        keys(uint64_t{layers} * kv_heads * n * dim);
    for (float& x : attention) x = std::abs(g(rng)) / n;
    for (float& x : keys) x = g(rng);
    const RkvInput in{.num_layers = layers,
                      .num_q_heads = q_heads,
                      .num_kv_heads = kv_heads,
                      .head_dim = dim,
                      .prompt_tokens = 0,
                      .length = n,
                      .queries = queries,
                      .attention = attention,
                      .keys = keys};
    auto next = RkvCompress(in, mask, config);
    ASSERT_TRUE(next.ok()) << next.status();
    for (uint32_t l = 0; l < layers; ++l) {
      EXPECT_EQ(next->KeptCount(l, 0), config.budget_tokens);
      for (uint64_t i = 0; i < n; ++i) {
        if (!mask.Kept(l, 0, i)) {
          EXPECT_FALSE(next->Kept(l, 0, i));
        }
        if (i + config.alpha >= n) {
          EXPECT_TRUE(next->Kept(l, 0, i));
        }
      }
    }
    mask = std::move(*next);
  }
  // Reaches 56 at n = 56, then every 16 steps: 56, 72, 88, 104, 120.
  EXPECT_EQ(compressions, 5);
}

// The vectorised redundancy is, bit for bit, the scalar definition (unit keys, cosine row with a
// zero diagonal and the most recent near-duplicate zeroed, mean, softmax), at random sizes that
// are not multiples of the vector width, with near-duplicate keys, over a subset of positions.
TEST(RkvTest, RedundancyIsTheScalarDefinitionExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  for (int trial = 0; trial < 8; ++trial) {
    const uint32_t dim = 3 + trial * 5, n = 5 + trial * 7;
    std::vector<float> keys(uint64_t{n} * dim);
    for (float& k : keys) k = normal(rng);
    for (uint32_t i = 2; i < n; i += 3) {  // near-duplicates of an earlier key
      for (uint32_t d = 0; d < dim; ++d)
        keys[i * dim + d] = keys[(i - 2) * dim + d] + 0.1f * normal(rng);
    }
    std::vector<float> attention(n, 1.0f / n);
    const RkvInput in{.num_layers = 1,
                      .num_q_heads = 1,
                      .num_kv_heads = 1,
                      .head_dim = dim,
                      .prompt_tokens = 0,
                      .length = n,
                      .queries = 1,
                      .attention = attention,
                      .keys = keys};
    std::vector<uint64_t> kept;
    for (uint64_t j = 0; j < n; ++j) {
      if (j % 4 != 1) kept.push_back(j);
    }
    const size_t m = kept.size();
    std::vector<std::vector<double>> unit(m, std::vector<double>(dim));
    for (size_t i = 0; i < m; ++i) {
      double norm = 0;
      for (uint32_t d = 0; d < dim; ++d)
        norm += double{keys[kept[i] * dim + d]} * keys[kept[i] * dim + d];
      norm = std::sqrt(norm) + 1e-8;
      for (uint32_t d = 0; d < dim; ++d) unit[i][d] = keys[kept[i] * dim + d] / norm;
    }
    std::vector<double> column(m, 0.0), row(m);
    for (size_t i = 0; i < m; ++i) {
      size_t last = m;
      for (size_t j = 0; j < m; ++j) {
        double dot = 0;
        if (j != i) {
          for (uint32_t d = 0; d < dim; ++d) dot += unit[i][d] * unit[j][d];
        }
        row[j] = dot;
        if (j != i && dot > 0.5) last = j;
      }
      if (last < m) row[last] = 0;
      for (size_t j = 0; j < m; ++j) column[j] += row[j] / static_cast<double>(m);
    }
    const double top = *std::max_element(column.begin(), column.end());
    double total = 0;
    for (double& c : column) total += (c = std::exp(c - top));
    RkvConfig config;
    config.lambda = 0;  // score = −redundancy
    config.alpha = 1;
    const std::vector<double> score = RkvScores(in, 0, 0, kept, config);
    ASSERT_EQ(score.size(), m);
    for (size_t c = 0; c < m; ++c) EXPECT_EQ(score[c], -(column[c] / total)) << trial << " " << c;
  }
}

TEST(RkvTest, RejectsBadInput) {
  Case c = MakeCase(10, 8, {});
  RkvConfig config;
  config.budget_tokens = 8;
  RkvInput in = c.Input();
  in.queries = 3;
  EXPECT_THAT(RkvCompress(in, KeepMask::AllKept(1, 1, 10), config).status().message(),
              HasSubstr("queries"));
  c.keys[5] = NAN;
  EXPECT_THAT(RkvCompress(c.Input(), KeepMask::AllKept(1, 1, 10), config).status().message(),
              HasSubstr("keys[layer 0, kv head 0, position 0]"));
  config.lambda = 2;
  EXPECT_THAT(RkvCompress(c.Input(), KeepMask::AllKept(1, 1, 10), config).status().message(),
              HasSubstr("lambda"));
  config = RkvConfig{};
  config.pool_width = 6;
  EXPECT_THAT(config.Validate().message(), HasSubstr("pool_width"));
}

}  // namespace
}  // namespace kvtier::tiering
