#include "edge/session.h"

#include <set>

#include "gtest/gtest.h"

namespace kvtier::edge {
namespace {

TEST(SessionSecretTest, SecretsAre128RandomBitsAndNeverRepeat) {
  std::set<std::string> seen;
  int bits = 0;
  for (int i = 0; i < 1000; ++i) {
    auto s = NewSecret();
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->size(), kSecretBytes);
    EXPECT_TRUE(seen.insert(*s).second);
    for (unsigned char c : *s) bits += __builtin_popcount(c);
  }
  // 128,000 fair bits: the count of ones is within a few standard deviations (~179) of half.
  EXPECT_NEAR(bits, 64000, 1500);
}

TEST(SessionSecretTest, CompareIsExactOnEveryByteAndTheLength) {
  const std::string a(16, 'a');
  EXPECT_TRUE(SecretsEqual(a, a));
  for (size_t i = 0; i < a.size(); ++i) {
    std::string b = a;
    b[i] ^= 1;
    EXPECT_FALSE(SecretsEqual(a, b)) << i;
  }
  EXPECT_FALSE(SecretsEqual(a, a.substr(0, 15)));
  EXPECT_FALSE(SecretsEqual(a, ""));
  EXPECT_TRUE(SecretsEqual("", ""));
}

}  // namespace
}  // namespace kvtier::edge
