// The GPU codec arithmetic (codec_math, run on the host through codec_reference) against the CPU
// codecs of worker/codecs: the same bytes for the same input, which is what lets T2 pages written
// by the GPU be read by the CPU backend and the other way round.

#include "worker/kernels/cuda/codec_math.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/codecs/codec.h"
#include "worker/codecs/fp8_e4m3.h"
#include "worker/kernels/cuda/codec_reference.h"
#include "worker/kernels/cuda/dtype.h"

namespace kvtier::worker::kernels::cuda {
namespace {

namespace ref = reference;

// The CPU codec fuses the quantizing multiply-add only on AVX2+FMA hosts; elsewhere it may
// differ from the fused GPU arithmetic by one code on an exact tie.
bool CpuFusesQuantize() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

TEST(CodecMathTest, E4m3MatchesTheCpuCodecOnEveryCodeAndOnRandomFloats) {
  for (int c = 0; c < 256; ++c) {
    const float x = codec_math::DecodeE4m3(static_cast<uint8_t>(c));
    const float want = codecs::DecodeE4m3(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(x)) << c;
    } else {
      EXPECT_EQ(x, want) << c;
      EXPECT_EQ(codec_math::EncodeE4m3(x), codecs::EncodeE4m3(x)) << c;
    }
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-12.f, 10.f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(1.f + (rng() % 1024) / 1024.f, static_cast<int>(mag(rng))) *
                    (rng() % 2 ? 1.f : -1.f);
    ASSERT_EQ(codec_math::EncodeE4m3(x), codecs::EncodeE4m3(x)) << x;
  }
}

struct Case {
  ref::Codec codec;
  const codecs::Codec* cpu;
};

std::vector<float> RandomTensor(uint32_t rows, uint32_t cols, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f + seed % 5);
  std::vector<float> t(uint64_t{rows} * cols);
  for (float& x : t) {
    x = n(rng) + (seed % 3 == 0 ? 3.f : 0.f);
    if (bf16) x = Bf16BitsToF32(F32ToBf16Bits(x));
  }
  if (seed % 4 == 1) std::fill(t.begin(), t.begin() + cols, 0.25f);  // a constant row
  return t;
}

TEST(CodecMathTest, ReferenceEncoderWritesTheCpuCodecsBytes) {
  const Case cases[] = {{ref::Codec::kInt8Kivi, &codecs::Int8KiviCodec()},
                        {ref::Codec::kFp8E4m3, &codecs::Fp8E4m3Codec()},
                        {ref::Codec::kMinMax, &codecs::MinMaxCodec()}};
  const bool exact = CpuFusesQuantize();
  for (const Case& k : cases) {
    for (bool key : {true, false}) {
      const codecs::TensorRole role = key ? codecs::TensorRole::kKey : codecs::TensorRole::kValue;
      for (uint32_t rows : {1u, 3u, 16u, 32u}) {
        for (uint32_t cols : {8u, 64u, 512u}) {
          const uint32_t seed = rows * 131 + cols + (key ? 7 : 0);
          const std::vector<float> t = RandomTensor(rows, cols, seed, seed % 2 == 0);
          const uint64_t bytes = ref::EncodedBytes(k.codec, key, rows, cols);
          ASSERT_EQ(bytes, k.cpu->encoded_bytes(role, rows, cols));
          std::vector<uint8_t> mine(bytes), cpu(bytes);
          ref::Encode(k.codec, key, t.data(), rows, cols, mine.data());
          k.cpu->encode(role, t.data(), rows, cols, cpu.data());
          const uint64_t header = bytes - uint64_t{rows} * cols;
          ASSERT_EQ(0, std::memcmp(mine.data(), cpu.data(), header))
              << k.cpu->name << " scales differ, rows " << rows << " cols " << cols;
          for (uint64_t i = header; i < bytes; ++i) {
            if (exact) {
              ASSERT_EQ(mine[i], cpu[i]) << k.cpu->name << " code " << i - header;
            } else {
              ASSERT_LE(std::abs(int{mine[i]} - int{cpu[i]}), 1);
            }
          }
          std::vector<float> a(t.size()), b(t.size());
          ref::Decode(k.codec, key, cpu.data(), rows, cols, a.data());
          k.cpu->decode(role, cpu.data(), rows, cols, b.data());
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << k.cpu->name;
        }
      }
    }
  }
}

TEST(CodecMathTest, AffineRoundTripErrorIsWithinHalfAStep) {
  const std::vector<float> t = RandomTensor(16, 512, 11, false);
  std::vector<uint8_t> enc(ref::EncodedBytes(ref::Codec::kInt8Kivi, false, 16, 512));
  std::vector<float> back(t.size());
  ref::Encode(ref::Codec::kInt8Kivi, false, t.data(), 16, 512, enc.data());
  ref::Decode(ref::Codec::kInt8Kivi, false, enc.data(), 16, 512, back.data());
  for (uint32_t r = 0; r < 16; ++r) {
    float scale;
    std::memcpy(&scale, enc.data() + 4 * r, 4);
    for (uint32_t c = 0; c < 512; ++c) {
      EXPECT_LE(std::fabs(back[r * 512 + c] - t[r * 512 + c]), scale * 0.5f + 1e-6f);
    }
  }
}

TEST(DtypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16Bits(1.f), 0x3F80);
  EXPECT_EQ(Bf16BitsToF32(F32ToBf16Bits(1.00390625f)), 1.f);        // tie -> even
  EXPECT_EQ(Bf16BitsToF32(F32ToBf16Bits(1.01171875f)), 1.015625f);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(Bf16BitsToF32(F32ToBf16Bits(std::nanf("")))));
}

}  // namespace
}  // namespace kvtier::worker::kernels::cuda
