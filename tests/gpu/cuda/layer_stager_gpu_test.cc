// The layer stager: offloads to a pinned shared-memory pool, layer prefetch into staging,
// differential re-staging, and the compressed (T2) path against the host codec reference.

#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "worker/cuda/layer_stager.h"
#include "worker/cuda/shm_region.h"
#include "worker/kernels/cuda/codec_reference.h"
#include "worker/kernels/cuda/dtype.h"

namespace kvtier::worker::cuda {
namespace {

using ::kvtier::testing::DeviceBuffer;
namespace kc = kernels::cuda;

constexpr uint32_t kBlocks = 10;

class LayerStagerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = ::kvtier::testing::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
    options_.page_tokens = 16;
    options_.num_kv_heads = 2;
    options_.head_dim = 64;
    options_.entries_per_slot = kBlocks;
    block_ = options_.BlockBytes();
    for (int i = 0; i < 2; ++i) {
      shm_[i] = *ShmRegion::Create(absl::StrCat("/kvtier-stager-", i, "-", getpid()), 4 << 20);
      // Small chunks: runs get cut at chunk boundaries.
      pool_[i] = *PinnedMapping::Create(shm_[i]->data(), shm_[i]->size(), {.chunk_bytes = 65536});
    }
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.f, 1.f);
    host_.resize(kBlocks * block_);
    for (uint64_t i = 0; i < host_.size() / 2; ++i) {
      const uint16_t h = kc::F32ToBf16Bits(n(rng));
      std::memcpy(host_.data() + 2 * i, &h, 2);
    }
    device_ = std::make_unique<DeviceBuffer<uint8_t>>(host_);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }

  std::vector<OffloadOp> Ops(uint64_t stride) const {
    std::vector<OffloadOp> ops;
    for (uint32_t i = 0; i < kBlocks; ++i) ops.push_back({device_->get() + i * block_, i * stride});
    return ops;
  }
  std::vector<StageRequest> Requests(StageSource source, uint64_t stride, uint64_t bytes) const {
    std::vector<StageRequest> r;
    for (uint32_t i = 0; i < kBlocks; ++i) r.push_back({i, 1, i * stride, bytes, source});
    return r;
  }
  // Staged blocks read back on the compute stream after Acquire.
  std::vector<uint8_t> ReadStaged(LayerStager& s, uint32_t layer, const StagedLayer& staged) {
    EXPECT_TRUE(s.Acquire(layer, compute_).ok());
    std::vector<uint8_t> out(staged.blocks.size() * block_);
    for (size_t i = 0; i < staged.blocks.size(); ++i) {
      EXPECT_EQ(cudaMemcpyAsync(out.data() + i * block_, staged.blocks[i], block_,
                                cudaMemcpyDeviceToHost, compute_),
                cudaSuccess);
    }
    EXPECT_TRUE(s.Release(layer, compute_).ok());
    EXPECT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
    return out;
  }

  LayerStagerOptions options_;
  uint64_t block_ = 0;
  std::unique_ptr<ShmRegion> shm_[2];
  std::unique_ptr<PinnedMapping> pool_[2];
  std::vector<uint8_t> host_;
  std::unique_ptr<DeviceBuffer<uint8_t>> device_;
  cudaStream_t compute_ = nullptr;
};

TEST_F(LayerStagerGpuTest, OffloadThenPrefetchRoundTripsTheBytes) {
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), nullptr);
  ASSERT_TRUE(s->Offload(Ops(block_), nullptr).ok());
  ASSERT_TRUE(s->WaitOffloads().ok());
  EXPECT_EQ(0, std::memcmp(shm_[0]->data(), host_.data(), host_.size()));
  absl::StatusOr<StagedLayer> staged = s->Prefetch(0, Requests(StageSource::kFull, block_, block_));
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->copied_bytes, kBlocks * block_);
  EXPECT_EQ(ReadStaged(*s, 0, *staged), host_);
}

TEST_F(LayerStagerGpuTest, UnchangedStagedPagesAreNotCopiedAgain) {
  options_.num_slots = 4;  // one slot per layer: staged pages survive between steps
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), nullptr);
  ASSERT_TRUE(s->Offload(Ops(block_), nullptr).ok());
  ASSERT_TRUE(s->WaitOffloads().ok());
  std::vector<StageRequest> reqs = Requests(StageSource::kFull, block_, block_);
  StagedLayer first = *s->Prefetch(1, reqs);
  ReadStaged(*s, 1, first);
  StagedLayer again = *s->Prefetch(1, reqs);
  EXPECT_EQ(again.copied_bytes, 0u);
  EXPECT_EQ(again.reused, kBlocks);
  EXPECT_EQ(again.blocks, first.blocks);
  // The host copy of page 4 changes: only it is copied, and the new bytes arrive.
  std::memset(shm_[0]->data() + 4 * block_, 0x3C, block_);
  reqs[4].version = 2;
  StagedLayer changed = *s->Prefetch(1, reqs);
  EXPECT_EQ(changed.copied_bytes, block_);
  const std::vector<uint8_t> got = ReadStaged(*s, 1, changed);
  EXPECT_EQ(0, std::memcmp(got.data(), shm_[0]->data(), got.size()));
}

TEST_F(LayerStagerGpuTest, DoubleBufferedSlotsAlternateAndRecopy) {
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), nullptr);
  ASSERT_TRUE(s->Offload(Ops(block_), nullptr).ok());
  ASSERT_TRUE(s->WaitOffloads().ok());
  const std::vector<StageRequest> reqs = Requests(StageSource::kFull, block_, block_);
  for (uint32_t layer : {0u, 1u, 2u, 3u, 0u}) {
    StagedLayer st = *s->Prefetch(layer, reqs);
    EXPECT_EQ(st.slot, layer % 2);
    EXPECT_EQ(st.copied_bytes, kBlocks * block_);
    EXPECT_EQ(ReadStaged(*s, layer, st), host_);
  }
  EXPECT_EQ(s->h2d_bytes(), 5 * kBlocks * block_);
}

TEST_F(LayerStagerGpuTest, RefusesToOverwriteASlotWhoseLayerIsNotReleased) {
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), nullptr);
  ASSERT_TRUE(s->Offload(Ops(block_), nullptr).ok());
  ASSERT_TRUE(s->WaitOffloads().ok());
  const std::vector<StageRequest> reqs = Requests(StageSource::kFull, block_, block_);
  ASSERT_TRUE(s->Prefetch(0, reqs).ok());
  EXPECT_TRUE(s->CanPrefetch(1));   // the other slot
  EXPECT_FALSE(s->CanPrefetch(2));  // layer 0's slot, not released yet
  EXPECT_EQ(s->Prefetch(2, reqs).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Release(0, compute_).ok());
  EXPECT_TRUE(s->Prefetch(2, reqs).ok());
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
}

TEST_F(LayerStagerGpuTest, CompressedPathMatchesTheHostCodec) {
  for (kc::CodecKind codec : {kc::CodecKind::kInt8Kivi, kc::CodecKind::kFp8E4m3}) {
    options_.codec = codec;
    std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), pool_[1].get());
    const uint64_t cbb = options_.CompressedBlockBytes(), ckb = options_.CompressedKeyBytes();
    const uint64_t stride = (cbb + 255) / 256 * 256;
    ASSERT_TRUE(s->OffloadCompressed(Ops(stride), nullptr).ok());
    ASSERT_TRUE(s->WaitOffloads().ok());
    const uint32_t rows = options_.page_tokens, cols = options_.num_kv_heads * options_.head_dim;
    const auto ref_codec = static_cast<kc::reference::Codec>(codec);
    std::vector<uint8_t> expect_staged(host_.size());
    for (uint32_t i = 0; i < kBlocks; ++i) {
      for (int half = 0; half < 2; ++half) {  // K then V
        std::vector<float> x(uint64_t{rows} * cols);
        for (size_t j = 0; j < x.size(); ++j) {
          uint16_t h;
          std::memcpy(&h, host_.data() + i * block_ + half * block_ / 2 + 2 * j, 2);
          x[j] = kc::Bf16BitsToF32(h);
        }
        const bool key = half == 0;
        std::vector<uint8_t> enc(kc::reference::EncodedBytes(ref_codec, key, rows, cols));
        kc::reference::Encode(ref_codec, key, x.data(), rows, cols, enc.data());
        ASSERT_EQ(
            0, std::memcmp(shm_[1]->data() + i * stride + (key ? 0 : ckb), enc.data(), enc.size()))
            << "block " << i << (key ? " K" : " V");
        std::vector<float> dec(x.size());
        kc::reference::Decode(ref_codec, key, enc.data(), rows, cols, dec.data());
        for (size_t j = 0; j < dec.size(); ++j) {
          const uint16_t h = kc::F32ToBf16Bits(dec[j]);
          std::memcpy(expect_staged.data() + i * block_ + half * block_ / 2 + 2 * j, &h, 2);
        }
      }
    }
    absl::StatusOr<StagedLayer> staged =
        s->Prefetch(0, Requests(StageSource::kCompressed, stride, cbb));
    ASSERT_TRUE(staged.ok()) << staged.status();
    EXPECT_EQ(staged->copied_bytes, kBlocks * cbb);
    EXPECT_EQ(ReadStaged(*s, 0, *staged), expect_staged);
  }
}

// T2 one page at a time, as the store moves pages: each page's blocks go through the scratch
// ring, the host waits for no earlier page until the ring wraps onto one still in flight, and
// every page's codes and its restore are what the one-batch path gives, across several laps.
TEST_F(LayerStagerGpuTest, CompressedPagesInARowRoundTripWithoutAHostWaitPerPage) {
  options_.max_offload_batch = 2 * kBlocks + 3;  // wraps every 2 pages, at a ragged end
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), pool_[1].get());
  const uint64_t cbb = options_.CompressedBlockBytes();
  const uint64_t stride = (cbb + 255) / 256 * 256;
  constexpr int kPages = 7;
  ASSERT_LE(kPages * kBlocks * stride, shm_[1]->size());
  for (int page = 0; page < kPages; ++page) {  // the same device blocks, a new T2 home each time
    std::vector<OffloadOp> ops = Ops(stride);
    for (OffloadOp& op : ops) op.dst_offset += page * kBlocks * stride;
    ASSERT_TRUE(s->OffloadCompressed(ops, nullptr).ok()) << page;
    if (page < 2) {
      EXPECT_EQ(s->scratch_host_waits(), 0u) << "waited for the page before";
    }
  }
  ASSERT_TRUE(s->WaitOffloads().ok());
  EXPECT_LE(s->scratch_host_waits(), uint64_t{kPages - 2}) << "at most one wait per wrap";
  for (int page = 1; page < kPages; ++page) {
    ASSERT_EQ(0, std::memcmp(shm_[1]->data(), shm_[1]->data() + page * kBlocks * stride,
                             kBlocks * stride))
        << "page " << page << "'s codes differ from page 0's";
  }
  // Restores, one page at a time, into fresh device blocks: each equals page 0's prefetch.
  absl::StatusOr<StagedLayer> staged =
      s->Prefetch(0, Requests(StageSource::kCompressed, stride, cbb));
  ASSERT_TRUE(staged.ok()) << staged.status();
  const std::vector<uint8_t> expect = ReadStaged(*s, 0, *staged);
  DeviceBuffer<uint8_t> restored(std::vector<uint8_t>(kPages * kBlocks * block_, 0));
  for (int page = 0; page < kPages; ++page) {
    std::vector<RestoreOp> ops;
    for (uint32_t i = 0; i < kBlocks; ++i) {
      ops.push_back({page * kBlocks * stride + i * stride,
                     restored.get() + (page * kBlocks + i) * block_, StageSource::kCompressed});
    }
    ASSERT_TRUE(s->Restore(ops, compute_).ok()) << page;
  }
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  std::vector<uint8_t> back(kPages * kBlocks * block_);
  ASSERT_EQ(cudaMemcpy(back.data(), restored.get(), back.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int page = 0; page < kPages; ++page) {
    EXPECT_EQ(0, std::memcmp(back.data() + page * kBlocks * block_, expect.data(), expect.size()))
        << "page " << page;
  }
}

TEST_F(LayerStagerGpuTest, RejectsWrongBlockSizesAndMissingT2) {
  std::unique_ptr<LayerStager> s = *LayerStager::Create(options_, pool_[0].get(), nullptr);
  EXPECT_EQ(s->Prefetch(0, Requests(StageSource::kFull, block_, block_ - 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Prefetch(0, Requests(StageSource::kCompressed, block_, 100)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->OffloadCompressed(Ops(block_), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier::worker::cuda
