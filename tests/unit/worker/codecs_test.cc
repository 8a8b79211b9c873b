#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/codecs/codec.h"
#include "worker/codecs/fp8_e4m3.h"

namespace kvtier::worker::codecs {
namespace {

using ::testing::HasSubstr;

std::vector<float> RandomTensor(uint32_t rows, uint32_t cols, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, spread);
  std::vector<float> x(size_t{rows} * cols);
  // Give channels different offsets and scales, as real keys have (outlier channels).
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < cols; ++c) x[r * cols + c] = n(rng) * (1.f + c % 5) + (c % 3) - 1.f;
  }
  return x;
}

std::vector<float> RoundTrip(const Codec& codec, TensorRole role, const std::vector<float>& x,
                             uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> enc(codec.encoded_bytes(role, rows, cols) + 7, 0xCD);
  codec.encode(role, x.data(), rows, cols, enc.data() + 7);  // unaligned on purpose
  std::vector<float> y(x.size(), -1.f);
  codec.decode(role, enc.data() + 7, rows, cols, y.data());
  return y;
}

// Brute-force nearest e4m3 value, ties to the even code, saturating at 448.
uint8_t NearestE4m3(float x) {
  if (std::isnan(x)) return 0x7F | (std::signbit(x) ? 0x80 : 0);
  const double a = std::min<double>(std::fabs(x), 448.0);
  uint8_t best = 0;
  double best_err = 1e300;
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(static_cast<double>(DecodeE4m3(static_cast<uint8_t>(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return best | (std::signbit(x) ? 0x80 : 0);
}

TEST(E4m3Test, EveryFiniteCodeRoundTripsExactly) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(DecodeE4m3(static_cast<uint8_t>(c))));
      continue;
    }
    const float v = DecodeE4m3(static_cast<uint8_t>(c));
    EXPECT_EQ(EncodeE4m3(v), c == 0x80 ? 0x80 : c) << "code " << c << " value " << v;
  }
}

TEST(E4m3Test, KnownValues) {
  EXPECT_EQ(DecodeE4m3(0x7E), 448.f);
  EXPECT_EQ(DecodeE4m3(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(DecodeE4m3(0x08), std::ldexp(1.f, -6));
  EXPECT_EQ(DecodeE4m3(0x38), 1.f);
  EXPECT_EQ(EncodeE4m3(1000.f), 0x7E);
  EXPECT_EQ(EncodeE4m3(-1e30f), 0xFE);
  EXPECT_EQ(EncodeE4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(EncodeE4m3(464.f), 0x7E);  // would round to 480: saturates
  EXPECT_EQ(EncodeE4m3(std::nanf("")) & 0x7F, 0x7F);
  // Ties to even: 1 + 1/16 lies between 1 (0x38, even) and 1.125 (0x39).
  EXPECT_EQ(EncodeE4m3(1.0625f), 0x38);
  EXPECT_EQ(EncodeE4m3(1.1875f), 0x3A);  // between 0x39 and 0x3A: even wins
  // Subnormal tie: 1.5 * 2^-9 between codes 1 and 2.
  EXPECT_EQ(EncodeE4m3(1.5f * std::ldexp(1.f, -9)), 0x02);
  EXPECT_EQ(EncodeE4m3(0.5f * std::ldexp(1.f, -9)), 0x00);
}

TEST(E4m3Test, MatchesBruteForceNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp(-12.f, 10.f);
  std::uniform_real_distribution<float> sign(-1.f, 1.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::copysign(std::exp2(exp(rng)), sign(rng));
    ASSERT_EQ(EncodeE4m3(x), NearestE4m3(x)) << "x=" << x;
  }
  // Every midpoint between neighbours (exact ties) as well.
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = (DecodeE4m3(c) + DecodeE4m3(c + 1)) / 2;
    ASSERT_EQ(EncodeE4m3(mid), NearestE4m3(mid)) << "mid=" << mid;
  }
}

TEST(Fp8E4m3CodecTest, RowEncoderAgreesWithScalarEncoderOnEveryCode) {
  // A row with absmax 448 has scale 1, so the codec's codes are EncodeE4m3 of the inputs
  // (vector path for the first 32-multiples, scalar tail). Includes ties and saturation.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exp(-12.f, 8.7f);
  std::vector<float> x = {448.f, -448.f, 0.f, -0.f, 1.0625f, 1.1875f, 3e-3f, -1e-4f};
  while (x.size() < 4096 + 7) x.push_back(std::copysign(std::exp2(exp(rng)), exp(rng)));
  for (int c = 0; c < 0x7E; ++c) x.push_back((DecodeE4m3(c) + DecodeE4m3(c + 1)) / 2);
  const uint32_t cols = static_cast<uint32_t>(x.size());
  std::vector<uint8_t> enc(Fp8E4m3Codec().encoded_bytes(TensorRole::kValue, 1, cols));
  Fp8E4m3Codec().encode(TensorRole::kValue, x.data(), 1, cols, enc.data());
  for (uint32_t c = 0; c < cols; ++c) ASSERT_EQ(enc[4 + c], EncodeE4m3(x[c])) << "x=" << x[c];
}

TEST(Int8KiviTest, KeyErrorBoundedPerChannel) {
  const uint32_t rows = 16, cols = 192;
  auto x = RandomTensor(rows, cols, 1, 2.f);
  auto y = RoundTrip(Int8KiviCodec(), TensorRole::kKey, x, rows, cols);
  for (uint32_t c = 0; c < cols; ++c) {
    float lo = x[c], hi = x[c];
    for (uint32_t r = 0; r < rows; ++r) {
      lo = std::min(lo, x[r * cols + c]);
      hi = std::max(hi, x[r * cols + c]);
    }
    const float bound = (hi - lo) / 255.f * 0.5f * 1.001f + 1e-6f;
    for (uint32_t r = 0; r < rows; ++r) {
      ASSERT_LE(std::fabs(x[r * cols + c] - y[r * cols + c]), bound) << r << "," << c;
    }
  }
}

TEST(Int8KiviTest, ValueErrorBoundedPerToken) {
  const uint32_t rows = 7, cols = 64;
  auto x = RandomTensor(rows, cols, 2, 1.f);
  auto y = RoundTrip(Int8KiviCodec(), TensorRole::kValue, x, rows, cols);
  for (uint32_t r = 0; r < rows; ++r) {
    float lo = x[r * cols], hi = lo;
    for (uint32_t c = 0; c < cols; ++c) {
      lo = std::min(lo, x[r * cols + c]);
      hi = std::max(hi, x[r * cols + c]);
    }
    const float bound = (hi - lo) / 255.f * 0.5f * 1.001f + 1e-6f;
    for (uint32_t c = 0; c < cols; ++c) {
      ASSERT_LE(std::fabs(x[r * cols + c] - y[r * cols + c]), bound) << r << "," << c;
    }
  }
}

TEST(Int8KiviTest, ConstantGroupsAreExact) {
  std::vector<float> x(4 * 8, 3.25f);
  EXPECT_EQ(RoundTrip(Int8KiviCodec(), TensorRole::kKey, x, 4, 8), x);
  EXPECT_EQ(RoundTrip(Int8KiviCodec(), TensorRole::kValue, x, 4, 8), x);
}

TEST(Int8KiviTest, KeysUsePerChannelScalesNotPerTensor) {
  // One huge channel must not destroy the precision of the others (the point of KIVI).
  const uint32_t rows = 16, cols = 8;
  auto x = RandomTensor(rows, cols, 3, 0.01f);
  for (uint32_t r = 0; r < rows; ++r) x[r * cols] = 1000.f * (r % 2 ? 1 : -1);
  auto kivi = RoundTrip(Int8KiviCodec(), TensorRole::kKey, x, rows, cols);
  auto minmax = RoundTrip(MinMaxCodec(), TensorRole::kKey, x, rows, cols);
  double err_kivi = 0, err_minmax = 0;
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 1; c < cols; ++c) {
      err_kivi += std::fabs(kivi[r * cols + c] - x[r * cols + c]);
      err_minmax += std::fabs(minmax[r * cols + c] - x[r * cols + c]);
    }
  }
  EXPECT_LT(err_kivi * 100, err_minmax);
}

TEST(Fp8E4m3CodecTest, ErrorBoundedRelativeToRowScale) {
  const uint32_t rows = 16, cols = 192;
  auto x = RandomTensor(rows, cols, 4, 3.f);
  for (TensorRole role : {TensorRole::kKey, TensorRole::kValue}) {
    auto y = RoundTrip(Fp8E4m3Codec(), role, x, rows, cols);
    for (uint32_t r = 0; r < rows; ++r) {
      float absmax = 0;
      for (uint32_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(x[r * cols + c]));
      const float scale = absmax / 448.f;
      for (uint32_t c = 0; c < cols; ++c) {
        const float v = x[r * cols + c];
        // Half an ulp of a 3-bit mantissa (2^-4 relative), or half a subnormal step.
        const float bound = std::max(std::fabs(v) / 16.f, scale * std::ldexp(1.f, -10)) * 1.001f;
        ASSERT_LE(std::fabs(v - y[r * cols + c]), bound + 1e-7f) << r << "," << c;
      }
    }
  }
}

TEST(Fp8E4m3CodecTest, RepresentableRowsRoundTripExactly) {
  // Rows whose absmax is 448 have scale 1: every e4m3 value survives unchanged.
  const uint32_t cols = 254;
  std::vector<float> x;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) x.push_back(DecodeE4m3(static_cast<uint8_t>(c)));
  }
  ASSERT_EQ(x.size(), cols);
  EXPECT_EQ(RoundTrip(Fp8E4m3Codec(), TensorRole::kValue, x, 1, cols), x);
}

TEST(MinMaxCodecTest, ErrorBoundedPerTensor) {
  const uint32_t rows = 16, cols = 64;
  auto x = RandomTensor(rows, cols, 5, 1.f);
  auto y = RoundTrip(MinMaxCodec(), TensorRole::kKey, x, rows, cols);
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  const float bound = (*hi - *lo) / 255.f * 0.5f * 1.001f;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(x[i] - y[i]), bound) << i;
}

TEST(CodecTest, EncodedBytesMatchTheDocumentedLayouts) {
  EXPECT_EQ(Int8KiviCodec().encoded_bytes(TensorRole::kKey, 16, 192), 192 * 8 + 16 * 192);
  EXPECT_EQ(Int8KiviCodec().encoded_bytes(TensorRole::kValue, 16, 192), 16 * 8 + 16 * 192);
  EXPECT_EQ(Fp8E4m3Codec().encoded_bytes(TensorRole::kKey, 16, 192), 16 * 4 + 16 * 192);
  EXPECT_EQ(MinMaxCodec().encoded_bytes(TensorRole::kValue, 16, 192), 8 + 16 * 192);
}

TEST(CodecTest, EncodeWritesExactlyEncodedBytes) {
  for (const Codec* codec : {&Int8KiviCodec(), &Fp8E4m3Codec(), &MinMaxCodec()}) {
    for (TensorRole role : {TensorRole::kKey, TensorRole::kValue}) {
      auto x = RandomTensor(5, 24, 6, 1.f);
      const uint64_t n = codec->encoded_bytes(role, 5, 24);
      std::vector<uint8_t> buf(n + 16, 0xAB);
      codec->encode(role, x.data(), 5, 24, buf.data());
      for (uint64_t i = n; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xAB) << codec->name;
    }
  }
}

TEST(CodecRegistryTest, FindsEveryNamedCodec) {
  for (std::string_view name : CodecNames()) {
    auto c = FindCodec(name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->name, name);
  }
  EXPECT_EQ(CodecNames().size(), 3u);
}

TEST(CodecRegistryTest, RejectsUnknownNameNamingIt) {
  auto c = FindCodec("int4");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("int4"));
}

}  // namespace
}  // namespace kvtier::worker::codecs
