#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::engine {
namespace {

TEST(SamplerTest, GreedyTakesTheLowestIndexOfTheMaximumAndSkipsNan) {
  EXPECT_EQ(Sampler::Argmax(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(Sampler::Argmax(std::vector<float>{NAN, -5, NAN, -4}), 3);
  auto s = Sampler::Create({});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Sample(std::vector<float>{0, 9, 1}), 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i) * 2;
  auto draw = [&](uint64_t seed) {
    auto s = Sampler::Create({1.0f, 1.0f, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s->Sample(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, FrequenciesFollowTheTemperedSoftmax) {
  std::vector<float> logits = {0.f, 1.f, 2.f};
  auto s = Sampler::Create({2.0f, 1.0f, 3});
  std::map<int32_t, int> counts;
  const int n = 60000;
  for (int i = 0; i < n; ++i) counts[s->Sample(logits)]++;
  double z = std::exp(0.0) + std::exp(0.5) + std::exp(1.0);
  for (int k = 0; k < 3; ++k) {
    const double p = std::exp(k / 2.0) / z;
    EXPECT_NEAR(counts[k] / double(n), p, 4 * std::sqrt(p * (1 - p) / n)) << k;
  }
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  std::vector<float> logits = {5.f, 4.f, -3.f, -3.f, -4.f};  // top two hold > 99% of the mass
  auto s = Sampler::Create({1.0f, 0.9f, 11});
  for (int i = 0; i < 2000; ++i) EXPECT_LE(s->Sample(logits), 1);
  auto tiny = Sampler::Create({1.0f, 1e-6f, 11});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(tiny->Sample(logits), 0);
}

TEST(SamplerTest, RejectsBadOptions) {
  EXPECT_FALSE(Sampler::Create({-1.f}).ok());
  EXPECT_FALSE(Sampler::Create({NAN}).ok());
  EXPECT_FALSE(Sampler::Create({1.f, 0.f}).ok());
  EXPECT_FALSE(Sampler::Create({1.f, 1.5f}).ok());
}

}  // namespace
}  // namespace kvtier::engine
