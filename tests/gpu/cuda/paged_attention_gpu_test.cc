// Paged decode attention on the GPU against the worker's CPU attention (worker/kernels), over a
// grid of shapes; and bit-identity of the output whatever the pages' placement.
//
// Tolerances: output |gpu - cpu| <= 2e-5 + 2e-4 |cpu|; position mass |gpu - cpu| <= 1e-6 +
// 1e-4 |cpu|. Both kernels compute in f32 with different reduction orders (warp trees on the GPU,
// vector lanes on the CPU); bf16 KV is widened exactly on both sides.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/tiering/scores.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/kernels/attention_cpu.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::kernels::cuda {
namespace {

using ::kvtier::testing::DeviceBuffer;

struct Shape {
  uint32_t kv_heads, group, head_dim, page_tokens;
  KvDtype dtype;
  std::vector<uint32_t> lengths;
  double evict_prob;
};

// Logical cache: per sequence, per page, a block K [pt][kvh][hd] then V (f32 values, already
// rounded to bf16 when the dtype is bf16); an empty block is an evicted page.
struct Cache {
  Shape shape;
  std::vector<std::vector<std::vector<float>>> blocks;
  std::vector<float> q;  // [batch][qh][hd]
  uint32_t q_heads() const { return shape.kv_heads * shape.group; }
  uint64_t block_elems() const {
    return 2ull * shape.page_tokens * shape.kv_heads * shape.head_dim;
  }
};

Cache MakeCache(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<double> u(0, 1);
  Cache c{s, {}, {}};
  const float q_scale = 1.f + seed % 3;
  for (uint32_t len : s.lengths) {
    const uint32_t pages = (len + s.page_tokens - 1) / s.page_tokens;
    std::vector<std::vector<float>> seq(pages);
    for (auto& block : seq) {
      if (u(rng) < s.evict_prob) continue;
      block.resize(c.block_elems());
      for (float& x : block) {
        x = n(rng);
        if (s.dtype == KvDtype::kBf16) x = Bf16BitsToF32(F32ToBf16Bits(x));
      }
    }
    c.blocks.push_back(std::move(seq));
  }
  c.q.resize(s.lengths.size() * c.q_heads() * s.head_dim);
  for (float& x : c.q) x = q_scale * n(rng);
  return c;
}

struct CpuResult {
  std::vector<float> out;   // [batch][qh][hd]
  std::vector<float> mass;  // [batch][stride]
};

CpuResult RunCpu(const Cache& c, uint32_t stride) {
  const Shape& s = c.shape;
  const uint32_t row = s.kv_heads * s.head_dim;
  CpuResult r{std::vector<float>(c.q.size()), std::vector<float>(s.lengths.size() * stride, 0.f)};
  for (size_t b = 0; b < s.lengths.size(); ++b) {
    const uint32_t len = s.lengths[b];
    std::vector<const float*> k(len), v(len);
    for (uint32_t p = 0; p < len; ++p) {
      const std::vector<float>& block = c.blocks[b][p / s.page_tokens];
      if (block.empty()) continue;
      k[p] = block.data() + (p % s.page_tokens) * row;
      v[p] = k[p] + uint64_t{s.page_tokens} * row;
    }
    std::vector<float> scratch(AttentionScratchFloats(c.q_heads(), len));
    AttentionParams p;
    p.q = c.q.data() + b * c.q_heads() * s.head_dim;
    p.out = r.out.data() + b * c.q_heads() * s.head_dim;
    p.position_mass = r.mass.data() + b * stride;
    p.k_rows = k.data();
    p.v_rows = v.data();
    p.length = len;
    p.num_queries = 1;
    p.num_q_heads = c.q_heads();
    p.num_kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
    p.scratch = scratch.data();
    Attention(p);
  }
  return r;
}

// Device copy of a cache. `where(b, page)` picks the buffer (0 or 1) and the order of blocks
// within buffers follows `order`, so one logical cache can be laid out many ways.
struct DeviceCache {
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> buffers;
  std::vector<const void*> table;
  std::vector<int32_t> indptr;
};

DeviceCache Upload(const Cache& c, uint32_t seed, bool scatter) {
  const uint64_t block_bytes = c.block_elems() * DtypeBytes(c.shape.dtype);
  std::vector<std::pair<uint32_t, uint32_t>> ids;  // (b, page) of every stored block
  DeviceCache d;
  d.indptr.push_back(0);
  for (uint32_t b = 0; b < c.blocks.size(); ++b) {
    for (uint32_t p = 0; p < c.blocks[b].size(); ++p) ids.push_back({b, p});
    d.indptr.push_back(static_cast<int32_t>(d.indptr.back() + c.blocks[b].size()));
  }
  std::vector<uint32_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  if (scatter) std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < 2; ++i) {
    d.buffers.push_back(std::make_unique<DeviceBuffer<uint8_t>>(ids.size() * block_bytes + 256));
  }
  d.table.assign(ids.size(), nullptr);
  for (uint32_t slot = 0; slot < order.size(); ++slot) {
    const auto [b, p] = ids[order[slot]];
    const std::vector<float>& block = c.blocks[b][p];
    if (block.empty()) continue;
    const int buf = scatter ? static_cast<int>(rng() % 2) : 0;
    uint8_t* dst = d.buffers[buf]->get() + slot * block_bytes;
    std::vector<uint8_t> bytes(block_bytes);
    if (c.shape.dtype == KvDtype::kF32) {
      std::memcpy(bytes.data(), block.data(), block_bytes);
    } else {
      for (size_t i = 0; i < block.size(); ++i) {
        const uint16_t h = F32ToBf16Bits(block[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    EXPECT_EQ(cudaMemcpy(dst, bytes.data(), block_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    d.table[d.indptr[b] + p] = dst;
  }
  return d;
}

struct GpuResult {
  std::vector<float> out, mass;
};

GpuResult RunGpu(const Cache& c, const DeviceCache& d, uint32_t stride, cudaError_t* err) {
  const Shape& s = c.shape;
  const uint32_t batch = static_cast<uint32_t>(s.lengths.size());
  const uint32_t max_len = *std::max_element(s.lengths.begin(), s.lengths.end());
  DeviceBuffer<float> q(c.q), out(c.q.size()), mass(uint64_t{batch} * stride);
  DeviceBuffer<const void*> table(d.table);
  DeviceBuffer<int32_t> indptr(d.indptr);
  std::vector<int32_t> lens(s.lengths.begin(), s.lengths.end());
  DeviceBuffer<int32_t> lengths(lens);
  DeviceBuffer<uint8_t> ws(PagedDecodeWorkspaceBytes(batch, max_len, c.q_heads(), s.head_dim));
  cudaMemset(mass.get(), 0xFF, mass.size() * 4);  // NaN: untouched positions stay visible
  PagedDecodeParams p;
  p.q = q.get();
  p.out = out.get();
  p.pages = table.get();
  p.page_indptr = indptr.get();
  p.lengths = lengths.get();
  p.position_mass = mass.get();
  p.mass_stride = stride;
  p.workspace = ws.get();
  p.batch = batch;
  p.max_length = max_len;
  p.num_q_heads = c.q_heads();
  p.num_kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.page_tokens = s.page_tokens;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  p.kv_dtype = s.dtype;
  *err = PagedDecodeAttention(p, nullptr);
  if (*err == cudaSuccess) *err = cudaDeviceSynchronize();
  return {out.Download(), mass.Download()};
}

std::vector<Shape> Grid() {
  std::vector<Shape> grid;
  const std::vector<std::vector<uint32_t>> lengths = {{1}, {63, 64, 65}, {300, 1, 129}, {1000}};
  const std::pair<uint32_t, uint32_t> heads[] = {{1, 1}, {2, 4}, {4, 7}, {1, 8}};
  int i = 0;
  for (uint32_t hd : {64u, 128u}) {
    for (KvDtype t : {KvDtype::kF32, KvDtype::kBf16}) {
      for (const auto& [kvh, group] : heads) {
        for (uint32_t pt : {1u, 16u}) {
          grid.push_back(
              {kvh, group, hd, pt, t, lengths[i % lengths.size()], i % 3 == 0 ? 0.2 : 0});
          ++i;
        }
      }
    }
  }
  return grid;
}

std::string Describe(const Shape& s) {
  std::string lens;
  for (uint32_t l : s.lengths) lens += std::to_string(l) + ",";
  return "kvh " + std::to_string(s.kv_heads) + " group " + std::to_string(s.group) + " hd " +
         std::to_string(s.head_dim) + " pt " + std::to_string(s.page_tokens) + " dtype " +
         std::to_string(static_cast<int>(s.dtype)) + " lengths " + lens + " evict " +
         std::to_string(s.evict_prob);
}

TEST(PagedAttentionGpuTest, MatchesCpuAttentionOverAGridOfShapes) {
  KVTIER_SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const Shape& s : Grid()) {
    SCOPED_TRACE(Describe(s));
    const Cache c = MakeCache(s, seed++);
    const uint32_t stride = *std::max_element(s.lengths.begin(), s.lengths.end()) + 3;
    const CpuResult want = RunCpu(c, stride);
    cudaError_t err;
    const GpuResult got = RunGpu(c, Upload(c, seed, true), stride, &err);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
    for (size_t i = 0; i < want.out.size(); ++i) {
      ASSERT_NEAR(got.out[i], want.out[i], 2e-5 + 2e-4 * std::fabs(want.out[i])) << "out " << i;
    }
    for (size_t b = 0; b < s.lengths.size(); ++b) {
      for (uint32_t p = 0; p < stride; ++p) {
        const float g = got.mass[b * stride + p];
        if (p >= s.lengths[b]) {
          ASSERT_TRUE(std::isnan(g)) << "position " << p << " past the length was written";
          continue;
        }
        const float w = want.mass[b * stride + p];
        ASSERT_NEAR(g, w, 1e-6 + 1e-4 * std::fabs(w)) << "mass b " << b << " p " << p;
      }
    }
  }
}

// The zero-error property on the GPU: the same KV values behind any page placement (contiguous
// in one buffer, or shuffled across two buffers as T0 pages and staged T1 pages are) give the
// same bits.
TEST(PagedAttentionGpuTest, OutputIsBitIdenticalWhateverThePlacement) {
  KVTIER_SKIP_WITHOUT_GPU();
  for (const Shape& s : Grid()) {
    SCOPED_TRACE(Describe(s));
    const Cache c = MakeCache(s, 99);
    const uint32_t stride = *std::max_element(s.lengths.begin(), s.lengths.end());
    cudaError_t e1, e2, e3;
    const GpuResult a = RunGpu(c, Upload(c, 1, false), stride, &e1);
    const GpuResult b = RunGpu(c, Upload(c, 2, true), stride, &e2);
    const GpuResult d = RunGpu(c, Upload(c, 3, true), stride, &e3);
    ASSERT_EQ(e1, cudaSuccess);
    ASSERT_EQ(e2, cudaSuccess);
    ASSERT_EQ(e3, cudaSuccess);
    ASSERT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4));
    ASSERT_EQ(0, std::memcmp(a.out.data(), d.out.data(), a.out.size() * 4));
    ASSERT_EQ(0, std::memcmp(a.mass.data(), b.mass.data(), a.mass.size() * 4));
  }
}

TEST(PagedAttentionGpuTest, RejectsBadParamsWithoutLaunching) {
  KVTIER_SKIP_WITHOUT_GPU();
  PagedDecodeParams p;
  EXPECT_EQ(PagedDecodeAttention(p, nullptr), cudaErrorInvalidValue);  // null pointers
  DeviceBuffer<float> f(1 << 16);
  DeviceBuffer<const void*> t(4);
  DeviceBuffer<int32_t> i(4);
  p.q = f.get();
  p.out = f.get();
  p.pages = t.get();
  p.page_indptr = i.get();
  p.lengths = i.get();
  p.workspace = f.get();
  p.batch = 1;
  p.max_length = 4;
  p.num_q_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 96;  // unsupported
  p.page_tokens = 4;
  p.scale = 0.1f;
  EXPECT_EQ(PagedDecodeAttention(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 64;
  p.num_q_heads = 18;  // group 9 > 8
  EXPECT_EQ(PagedDecodeAttention(p, nullptr), cudaErrorInvalidValue);
  p.num_q_heads = 8;
  p.scale = 0.f;
  EXPECT_EQ(PagedDecodeAttention(p, nullptr), cudaErrorInvalidValue);
}

TEST(PagedAttentionGpuTest, AccumulatedMassAddsLayers) {
  KVTIER_SKIP_WITHOUT_GPU();
  const Shape s{2, 4, 128, 16, KvDtype::kBf16, {200, 77}, 0.0};
  const Cache c = MakeCache(s, 5);
  const DeviceCache d = Upload(c, 5, true);
  const uint32_t stride = 200;
  cudaError_t err;
  const GpuResult once = RunGpu(c, d, stride, &err);
  ASSERT_EQ(err, cudaSuccess);
  // Run again over the same mass buffer with accumulate on: each position doubles exactly.
  DeviceBuffer<float> q(c.q), out(c.q.size()), mass(once.mass);
  DeviceBuffer<const void*> table(d.table);
  DeviceBuffer<int32_t> indptr(d.indptr), lengths(std::vector<int32_t>{200, 77});
  DeviceBuffer<uint8_t> ws(PagedDecodeWorkspaceBytes(2, 200, 8, 128));
  PagedDecodeParams p;
  p.q = q.get();
  p.out = out.get();
  p.pages = table.get();
  p.page_indptr = indptr.get();
  p.lengths = lengths.get();
  p.position_mass = mass.get();
  p.mass_stride = stride;
  p.accumulate_mass = true;
  p.workspace = ws.get();
  p.batch = 2;
  p.max_length = 200;
  p.num_q_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.page_tokens = 16;
  p.scale = 1.f / std::sqrt(128.f);
  ASSERT_CUDA_OK(PagedDecodeAttention(p, nullptr));
  const std::vector<float> twice = mass.Download();
  for (uint32_t i = 0; i < 77; ++i) EXPECT_EQ(twice[stride + i], 2 * once.mass[stride + i]);
  float total = 0;
  for (uint32_t i = 0; i < 200; ++i) total += once.mass[i];
  EXPECT_NEAR(total, 8.f, 1e-3);  // softmax weights summed over 8 query heads
}

// The device score rule equals its CPU reference bit for bit: row b adds mass * weight to the
// positions it covers, rows in order, one rounded multiply and one rounded add each.
TEST(AccumulateScoresGpuTest, EqualsTheCpuReferenceBitForBit) {
  KVTIER_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0.f, 3.f);
  const uint32_t rows = 5, first = 100, stride = 120, n = first + rows - 1;
  std::vector<float> mass(rows * stride), scores(n);
  for (float& m : mass) m = u(rng);
  for (float& x : scores) x = u(rng);
  const float weight = tiering::DeviceMassWeight(9, 30);
  std::vector<float> expected = scores;
  for (uint32_t b = 0; b < rows; ++b) {
    tiering::AccumulateDeviceMass(absl::MakeConstSpan(mass).subspan(b * stride, first + b), weight,
                                  absl::MakeSpan(expected));
  }
  DeviceBuffer<float> dm(mass), ds(scores);
  ScoreAccumulateParams p;
  p.mass = dm.get();
  p.rows = rows;
  p.mass_stride = stride;
  p.first_length = first;
  p.weight = weight;
  p.scores = ds.get();
  ASSERT_CUDA_OK(AccumulateScores(p, nullptr));
  const std::vector<float> got = ds.Download();
  ASSERT_EQ(0, std::memcmp(got.data(), expected.data(), n * sizeof(float)));
  p.mass_stride = n - 1;  // shorter than the positions the last row covers
  EXPECT_EQ(AccumulateScores(p, nullptr), cudaErrorInvalidValue);
}

// One launch for the rows of several sequences (one of them a prefill's three rows) gives each
// sequence's scores the bits of the CPU reference, row by row in order.
TEST(AccumulateScoresGpuTest, ABatchGivesEachSequenceTheCpuReferenceBitForBit) {
  KVTIER_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> u(0.f, 3.f);
  const std::vector<int32_t> lengths = {100, 50, 51, 52, 77};
  const std::vector<int> owner = {0, 1, 1, 1, 2};  // rows 1..3: one sequence's prefill
  const uint32_t rows = 5, stride = 128, max_length = 100;
  std::vector<float> mass(rows * stride);
  for (float& m : mass) m = u(rng);
  std::vector<std::vector<float>> scores = {std::vector<float>(100), std::vector<float>(52),
                                            std::vector<float>(77)};
  for (auto& row : scores) {
    for (float& x : row) x = u(rng);
  }
  const float weight = tiering::DeviceMassWeight(28, 28);
  std::vector<std::vector<float>> expected = scores;
  for (uint32_t b = 0; b < rows; ++b) {
    tiering::AccumulateDeviceMass(absl::MakeConstSpan(mass).subspan(b * stride, lengths[b]), weight,
                                  absl::MakeSpan(expected[owner[b]]));
  }
  DeviceBuffer<float> dm(mass), s0(scores[0]), s1(scores[1]), s2(scores[2]);
  DeviceBuffer<int32_t> dl(lengths);
  float* const seq[] = {s0.get(), s1.get(), s2.get()};
  std::vector<float*> rows_scores;
  for (int o : owner) rows_scores.push_back(seq[o]);
  DeviceBuffer<float*> dp(rows_scores);
  ScoreBatchParams p;
  p.mass = dm.get();
  p.rows = rows;
  p.mass_stride = stride;
  p.max_length = max_length;
  p.lengths = dl.get();
  p.scores = dp.get();
  p.weight = weight;
  ASSERT_CUDA_OK(AccumulateScoresBatch(p, nullptr));
  const std::vector<std::vector<float>> got = {s0.Download(), s1.Download(), s2.Download()};
  for (int q = 0; q < 3; ++q) {
    ASSERT_EQ(got[q].size(), expected[q].size());
    EXPECT_EQ(0, std::memcmp(got[q].data(), expected[q].data(), got[q].size() * sizeof(float)))
        << "sequence " << q;
  }
  p.mass_stride = max_length - 1;  // shorter than the longest row
  EXPECT_EQ(AccumulateScoresBatch(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvtier::worker::kernels::cuda
